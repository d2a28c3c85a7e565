"""The benchmarks of `brigade bench <target>`: each measures one part of Brigade and returns a
report, printed as JSON. They stand above every other floor (they may import anything), so the
library packages they measure never carry them."""
