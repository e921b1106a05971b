// Instantiates the forward-products and backward kernels for one product mode (kTf32), all three
// input dtypes. One file per mode so that parallel builds (ninja, MAX_JOBS) compile them side by side.
#include "flow_backward.cuh"
#include "flow_products.cuh"

namespace phf_flow {
template cudaError_t launch_products<kTf32>(FlowParams&, DType, cudaStream_t);
template cudaError_t launch_backward<kTf32>(const FlowParams&, DType, cudaStream_t);
}  // namespace phf_flow
