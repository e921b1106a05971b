// Instantiates the forward-products and backward kernels for product mode kTf32x3, all three input
// dtypes: one small file per mode so parallel builds (ninja, MAX_JOBS) compile them side by side.
#include "flow_backward.cuh"
#include "flow_products.cuh"

namespace phf_flow {
template cudaError_t launch_products<kTf32x3>(FlowParams&, DType, cudaStream_t);
template cudaError_t launch_backward<kTf32x3>(const FlowParams&, DType, cudaStream_t);
}  // namespace phf_flow
