"""fraud_mlp as an MLServer custom runtime (MLServer speaks OIP itself)."""

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxFraud(MLModel):
    async def load(self) -> bool:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        self.session = ort.InferenceSession(self.settings.parameters.uri, so)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        y = self.session.run(None, {"features": x})[0]
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("probabilities", y)])
