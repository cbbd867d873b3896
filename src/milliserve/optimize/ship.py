"""Write the shipped variant into a model repository folder that ``milliserve serve``
(and Triton) load: ``1/model.onnx`` for ONNX Runtime, ``1/model.xml`` + ``model.bin``
for OpenVINO, and a ``config.pbtxt`` with the tensors, a batching suggestion and one
inference thread."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from milliserve.optimize.variant import Variant

__all__ = ["ship"]


def _tensors(source_onnx: Path) -> tuple[list[Any], list[Any], bool]:
    """Inputs, outputs and whether every tensor has a dynamic batch axis, read from the
    ONNX graph (an OpenVINO IR converted from it keeps its tensor names and types)."""
    import onnxruntime as ort

    from milliserve.backends.onnxruntime import tensor_spec

    sess = ort.InferenceSession(str(source_onnx), providers=["CPUExecutionProvider"])
    specs_in = [tensor_spec(i) for i in sess.get_inputs()]
    specs_out = [tensor_spec(o) for o in sess.get_outputs()]
    batched = all(s.dims and s.dims[0] == -1 for s in specs_in + specs_out)
    return specs_in, specs_out, batched


def _quoted(text: str) -> str:
    """A protobuf text-format string body: backslashes and double quotes escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def config_pbtxt(name: str, source_onnx: Path, variant: Variant, batching: dict[str, Any]) -> str:
    from milliserve.protocol.datatypes import oip_to_config_type

    specs_in, specs_out, batched = _tensors(source_onnx)

    def tensors(specs: list[Any]) -> str:
        return ", ".join(
            f'{{ name: "{_quoted(s.name)}" data_type: {oip_to_config_type(s.datatype)} '
            f"dims: [ {', '.join(str(d) for d in (s.dims[1:] if batched else s.dims))} ] }}"
            for s in specs
        )

    openvino = variant.runtime == "openvino"
    lines = [
        f'name: "{_quoted(name)}"',
        'platform: "openvino"' if openvino else 'platform: "onnxruntime_onnx"',
        f"max_batch_size: {32 if batched else 0}",
        f"input [ {tensors(specs_in)} ]",
        f"output [ {tensors(specs_out)} ]",
    ]
    if batched and batching:
        lines.append(
            f"dynamic_batching {{ preferred_batch_size: {batching['preferred_batch_size']} "
            f"max_queue_delay_microseconds: {batching['max_queue_delay_microseconds']} }}"
        )
    if openvino:
        lines.append('parameters { key: "INFERENCE_NUM_THREADS" value: { string_value: "1" } }')
        lines.append('parameters { key: "PERFORMANCE_HINT" value: { string_value: "LATENCY" } }')
        hint = variant.precision or "f32"
        lines.append(f'parameters {{ key: "INFERENCE_PRECISION_HINT" value: {{ string_value: "{hint}" }} }}')
    else:
        lines.append('parameters { key: "intra_op_thread_count" value: { string_value: "1" } }')
    return "\n".join(lines) + "\n"


def ship(variant: Variant, source_onnx: Path, output: Path, batching: dict[str, Any]) -> Path:
    """Write ``variant`` into ``output`` (``REPO/NAME``); returns the model file written."""
    assert variant.path is not None and variant.servable, f"{variant.name} cannot be served"
    vdir = output / "1"
    if vdir.exists():
        shutil.rmtree(vdir)
    vdir.mkdir(parents=True)
    if variant.runtime == "openvino":
        model_path = vdir / "model.xml"
        if variant.path.suffix == ".xml":
            shutil.copy(variant.path, model_path)
            shutil.copy(variant.path.with_suffix(".bin"), vdir / "model.bin")
        else:  # OpenVINO f32/bf16 run the ONNX graph: ship it converted, weights kept f32
            import openvino as ov

            ov.save_model(ov.convert_model(str(variant.path)), str(model_path), compress_to_fp16=False)
    else:
        model_path = vdir / "model.onnx"
        shutil.copy(variant.path, model_path)
    (output / "config.pbtxt").write_text(config_pbtxt(output.name, source_onnx, variant, batching))
    return model_path
