"""fraud_mlp on LitServe, OIP-shaped route (settings and why: peer_settings.py).
python litserve_app.py MODEL PORT MAX_BATCH BATCH_TIMEOUT_S [FAST_QUEUE: True|False] [WORKERS]"""

import sys

import litserve as ls
import numpy as np
import onnxruntime as ort


class FraudAPI(ls.LitAPI):
    def setup(self, device):
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        self.session = ort.InferenceSession(sys.argv[1], so)

    def decode_request(self, request):
        t = request["inputs"][0]
        return np.asarray(t["data"], dtype=np.float32).reshape(t["shape"])

    def batch(self, inputs):
        return np.concatenate(inputs)

    def predict(self, x):
        return self.session.run(None, {"features": x})[0]

    def unbatch(self, output):
        return [row[None, :] for row in output]

    def encode_response(self, output):
        return {
            "outputs": [
                {
                    "name": "probabilities",
                    "datatype": "FP32",
                    "shape": list(output.shape),
                    "data": output.reshape(-1).tolist(),
                }
            ]
        }


if __name__ == "__main__":
    batch = int(sys.argv[3])
    timeout = float(sys.argv[4]) if batch > 1 else 0.0
    fast_queue = len(sys.argv) > 5 and sys.argv[5] == "True"  # ZeroMQ transport (needs pyzmq)
    api = FraudAPI(max_batch_size=batch, batch_timeout=timeout, api_path="/v2/models/fraud_mlp/infer")
    workers = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    ls.LitServer(api, accelerator="cpu", workers_per_device=workers, fast_queue=fast_queue).run(
        port=int(sys.argv[2]),
        host="127.0.0.1",
        generate_client_file=False,  # no client.py left in the tree
        log_level="warning",  # as every server here: no line logged per request
        access_log=False,
    )
