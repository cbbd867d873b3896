"""A text model that takes raw strings: the tokenizer step (Rust tokenizers) in front of
the example MiniLM, through a real server and tritonclient."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from tokenizers import Tokenizer

from milliserve.examples.minilm import tokenizer_path
from milliserve.testing import ServerProcess

pytestmark = pytest.mark.e2e

CONFIG = """\
name: text_minilm
max_batch_size: 8
input:
  - {name: input_ids, data_type: TYPE_INT64, dims: [-1]}
  - {name: attention_mask, data_type: TYPE_INT64, dims: [-1]}
output:
  - {name: embedding, data_type: TYPE_FP32, dims: [384]}
tokenizer: {file: tokenizer.json, text_input: TEXT, max_length: 64}
"""


def test_raw_text_in_embeddings_out(example_repo: Path, tmp_path: Path) -> None:
    model = tmp_path / "repo" / "text_minilm"
    (model / "1").mkdir(parents=True)
    shutil.copy(example_repo / "minilm" / "1" / "model.onnx", model / "1" / "model.onnx")
    shutil.copy(tokenizer_path(), model / "tokenizer.json")
    (model / "config.yaml").write_text(CONFIG)
    texts = ["what a lovely day", "self-driving cars will never be safe, not in a million years"]

    tok = Tokenizer.from_file(str(tokenizer_path()))
    tok.enable_padding(pad_id=0)
    enc = tok.encode_batch(texts)
    feeds = {
        "input_ids": np.array([e.ids for e in enc], np.int64),
        "attention_mask": np.array([e.attention_mask for e in enc], np.int64),
    }
    sess = ort.InferenceSession(str(model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    expected = sess.run(["embedding"], feeds)[0]

    with (
        ServerProcess(tmp_path / "repo") as server,
        httpclient.InferenceServerClient(server.http_url) as client,
    ):
        text = httpclient.InferInput("TEXT", [2, 1], "BYTES")
        text.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
        result = client.infer("text_minilm", [text])
        np.testing.assert_allclose(result.as_numpy("embedding"), expected, atol=1e-5)
        wrong = httpclient.InferInput("INPUT", [1, 1], "BYTES")
        wrong.set_data_from_numpy(np.array([[b"x"]], dtype=object))
        with pytest.raises(Exception, match="needs the BYTES input 'TEXT'"):
            client.infer("text_minilm", [wrong])
        # the metadata lists what a client sends: the text, not the token tensors
        inputs = client.get_model_metadata("text_minilm")["inputs"]
        assert inputs == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]}]
