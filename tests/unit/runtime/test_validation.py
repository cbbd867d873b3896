"""Request validation against a model, before batching."""

from __future__ import annotations

import numpy as np
import pytest

from milliserve.errors import InvalidInputError
from milliserve.protocol.types import InferRequest, InferTensor, RequestedOutput, TensorSpec
from milliserve.runtime.validation import ModelIO, validate_request

IO = ModelIO(
    label="fraud_mlp",
    inputs={"features": TensorSpec("features", "FP32", (64,)), "ids": TensorSpec("ids", "INT64", (-1,))},
    outputs={"probabilities": TensorSpec("probabilities", "FP32", (2,))},
    max_batch_size=8,
)


def req(*tensors: InferTensor, outputs: list[str] | None = None) -> InferRequest:
    return InferRequest(
        "fraud_mlp", "", list(tensors), outputs=[RequestedOutput(o) for o in outputs] if outputs else None
    )


def t(name: str, dtype: str, shape: tuple[int, ...], value: float = 0.0) -> InferTensor:
    np_dtype = np.float32 if dtype == "FP32" else np.int64
    return InferTensor(name, dtype, shape, np.full(shape, value, dtype=np_dtype))


def test_valid_request_gives_batch_size_and_signature() -> None:
    size, sig = validate_request(req(t("features", "FP32", (3, 64)), t("ids", "INT64", (3, 7))), IO)
    assert size == 3 and sig == (("features", (64,)), ("ids", (7,)))


@pytest.mark.parametrize(
    ("tensors", "outputs", "match"),
    [
        (
            (t("features", "FP32", (1, 64)), t("ids", "INT64", (1, 2)), t("extra", "FP32", (1,))),
            None,
            r"input 'extra' is not an input of model 'fraud_mlp' \(expected \['features', 'ids'\]\)",
        ),
        ((t("features", "FP32", (1, 64)),), None, r"needs inputs \['ids'\]"),
        (
            (t("features", "INT64", (1, 64)), t("ids", "INT64", (1, 2))),
            None,
            r"input 'features' has datatype INT64 but model 'fraud_mlp' expects FP32",
        ),
        (
            (t("features", "FP32", (3, 5)), t("ids", "INT64", (3, 2))),
            None,
            r"input 'features' has shape \[3, 5\] but model 'fraud_mlp' expects \[-1, 64\]",
        ),
        ((t("features", "FP32", (9, 64)), t("ids", "INT64", (9, 2))), None, r"batch size 9 .* 1\.\.8"),
        (
            (t("features", "FP32", (2, 64)), t("ids", "INT64", (3, 2))),
            None,
            r"batch size 3 but other inputs have 2",
        ),
        (
            (t("features", "FP32", (1, 64), np.nan), t("ids", "INT64", (1, 2))),
            None,
            r"contains nan at flat index 0",
        ),
        (
            (t("features", "FP32", (1, 64)), t("ids", "INT64", (1, 2))),
            ["logits"],
            r"requested output 'logits'",
        ),
    ],
)
def test_invalid_requests_name_the_offending_input(
    tensors: tuple, outputs: list[str] | None, match: str
) -> None:
    with pytest.raises(InvalidInputError, match=match):
        validate_request(req(*tensors, outputs=outputs), IO)


def test_nonfinite_inputs_can_be_allowed() -> None:
    io = ModelIO(IO.label, IO.inputs, IO.outputs, IO.max_batch_size, allow_nonfinite=True)
    validate_request(req(t("features", "FP32", (1, 64), np.inf), t("ids", "INT64", (1, 1))), io)


def test_the_one_input_fast_path_agrees_with_the_general_check() -> None:
    io = ModelIO("one", {"x": TensorSpec("x", "FP32", (3,))}, {}, max_batch_size=4)
    ok = InferRequest("one", "", [InferTensor("x", "FP32", (2, 3), np.zeros((2, 3), np.float32))])
    assert validate_request(ok, io) == (2, (("x", (3,)),))
    for shape in [(), (5, 3), (0, 3), (2, 4), (2, 3, 1)]:
        bad = InferRequest("one", "", [InferTensor("x", "FP32", shape, np.zeros(shape, np.float32))])
        with pytest.raises(InvalidInputError):
            validate_request(bad, io)
    nan = InferRequest("one", "", [InferTensor("x", "FP32", (1, 3), np.full((1, 3), np.nan, np.float32))])
    with pytest.raises(InvalidInputError, match="non-finite"):
        validate_request(nan, io)
    wrong_type = InferRequest("one", "", [InferTensor("x", "FP64", (1, 3), np.zeros((1, 3)))])
    with pytest.raises(InvalidInputError, match="expects FP32"):
        validate_request(wrong_type, io)


def test_the_fast_path_with_two_inputs_still_catches_a_repeat_and_a_batch_mismatch() -> None:
    spec = {n: TensorSpec(n, "FP32", (2,)) for n in ("a", "b")}
    io = ModelIO("two", spec, {}, max_batch_size=4)

    def t(name: str, batch: int) -> InferTensor:
        return InferTensor(name, "FP32", (batch, 2), np.zeros((batch, 2), np.float32))

    assert validate_request(InferRequest("two", "", [t("b", 3), t("a", 3)]), io) == (
        3,
        (("a", (2,)), ("b", (2,))),
    )
    with pytest.raises(InvalidInputError, match="given twice"):
        validate_request(InferRequest("two", "", [t("a", 1), t("a", 1)]), io)
    with pytest.raises(InvalidInputError, match="other inputs have 2"):
        validate_request(InferRequest("two", "", [t("a", 2), t("b", 3)]), io)
