// The Python module of Brigade's CPU kernels (engine/kernels.py builds and loads it).
#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q4_linear", &brigade::q4_linear, "x @ W.T, W on a 4-bit block grid (scale, low)");
  m.def("q8_linear", &brigade::q8_linear, "x @ W.T, W on an 8-bit block grid (scale)");
  m.def("isa", &brigade::isa, "the vector instructions this build uses");
  m.def("attend", &brigade::attend, "a pass's attention, each query over exactly its keys, in a fixed order");
}
