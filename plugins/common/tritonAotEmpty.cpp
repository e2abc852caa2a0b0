// The kernel table of a library built without the Triton kernels (CMake FLASHSPEC_TRITON_AOT=OFF,
// or no Python with triton): every call runs the native CUDA kernels.
#include "tritonAotTable.h"

namespace flashspec::aot
{

Table const kTable{0, "none", nullptr, 0, nullptr, 0, nullptr, 0, nullptr, 0, nullptr, 0, nullptr, 0};

} // namespace flashspec::aot
