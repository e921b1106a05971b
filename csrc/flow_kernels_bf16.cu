// Instantiates the forward-products and backward kernels for product mode kBf16, all three input
// dtypes: one small file per mode so parallel builds (ninja, MAX_JOBS) compile them side by side.
#include "flow_backward.cuh"
#include "flow_products.cuh"

namespace phf_flow {
template cudaError_t launch_products<kBf16>(FlowParams&, DType, cudaStream_t);
template cudaError_t launch_backward<kBf16>(const FlowParams&, DType, cudaStream_t);
}  // namespace phf_flow
