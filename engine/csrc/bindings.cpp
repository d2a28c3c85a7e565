// The Python module of Brigade's CPU kernels (engine/kernels.py builds and loads it). Every kernel
// lets go of the GIL while it runs: a worker's other threads (its publisher, its heartbeat) run
// beside a step's products instead of after them.
#include <torch/csrc/utils/pybind.h>  // pybind11 and the tensor casters alone

#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q4_linear", &brigade::q4_linear, py::call_guard<py::gil_scoped_release>(), "x @ W.T, W on a 4-bit block grid (scale, low)");
  m.def("q8_linear", &brigade::q8_linear, py::call_guard<py::gil_scoped_release>(), "x @ W.T, W on an 8-bit block grid (scale)");
  m.def("half_linear", &brigade::half_linear, py::call_guard<py::gil_scoped_release>(), "x @ W.T, W's float32 values all bfloat16 or float16");
  m.def("rms_norm", &brigade::rms_norm, py::call_guard<py::gil_scoped_release>(), "Llama's RMSNorm of each row, the sum of squares in a fixed order");
  m.def("isa", &brigade::isa, "the vector instructions this build uses");
  py::class_<brigade::GridWeight>(m, "GridWeight")
      .def(py::init([](at::Tensor codes, std::optional<at::Tensor> scale, std::optional<at::Tensor> low,
                       std::optional<at::Tensor> bias) {
             return brigade::GridWeight{codes, scale.value_or(at::Tensor()), low.value_or(at::Tensor()),
                                        bias.value_or(at::Tensor())};
           }),
           py::arg("codes"), py::arg("scale"), py::arg("low"), py::arg("bias"));
  py::class_<brigade::DecoderLayer>(m, "DecoderLayer")
      .def(py::init<at::Tensor, at::Tensor, brigade::GridWeight, brigade::GridWeight, brigade::GridWeight,
                    brigade::GridWeight>(),
           py::arg("attn_norm"), py::arg("mlp_norm"), py::arg("qkv"), py::arg("o"), py::arg("gate_up"), py::arg("down"));
  py::class_<brigade::Decoder>(m, "Decoder")
      .def(py::init<std::vector<brigade::DecoderLayer>, double, int64_t, int64_t, int64_t, double, int64_t>())
      .def("forward", &brigade::Decoder::forward, py::call_guard<py::gil_scoped_release>(),
           "hidden after every decoder layer, in one call");
  m.def("attend", &brigade::attend, py::call_guard<py::gil_scoped_release>(), "a pass's attention, each query over exactly its keys, in a fixed order");
  m.def("attend_key_by_key", &brigade::attend_key_by_key, py::call_guard<py::gil_scoped_release>(), "attend's numbers, one key at a time (what it is held to)");
}
