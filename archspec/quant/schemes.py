"""The quantization schemes' names and int4's default group sizes: torch-free, so a sweep file's `quantize:` is checked
(and `archspec schema --sweep` lists them) without importing torch."""

SCHEMES = ("int8", "int4")
GROUP_SIZES = (128, 64, 32)  # int4's default: the largest that divides every quantized weight's input width
