"""llama.cpp's own ``llama-server``, built once from the llama.cpp tree that the installed
llama-cpp-python vendors (the same kernels as milliserve's engine), into a git-ignored
cache: ``build/peers/llama-server`` (about 5-8 minutes on 2 idle cores, then reused).

    python benchmarks/peers/llama_server.py      # build (or find) it and print its path
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "build" / "peers" / "llama-server"


def binary() -> Path:
    """The llama-server binary, built first when the cache lacks it."""
    ver = version("llama-cpp-python")
    out = ROOT / ver
    exe = out / "cbuild" / "bin" / "llama-server"
    if exe.is_file():
        return exe
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            sys.exit(f"building llama-server needs {tool}")
    out.mkdir(parents=True, exist_ok=True)
    dl = out / "dl"
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*pip, f"llama-cpp-python=={ver}", "-d", str(dl)], check=True)
    src = out / "src"
    src.mkdir(exist_ok=True)
    tarball = next(dl.glob("llama_cpp_python-*.tar.gz"))
    subprocess.run(["tar", "xzf", str(tarball), "-C", str(src), "--strip-components=1"], check=True)
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_SERVER=ON"]
    flags += [
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_CURL=OFF",
    ]
    subprocess.run(
        ["cmake", "-S", str(src / "vendor" / "llama.cpp"), "-B", str(out / "cbuild"), *flags], check=True
    )
    jobs = str(len(os.sched_getaffinity(0)))
    subprocess.run(
        ["cmake", "--build", str(out / "cbuild"), "--target", "llama-server", "-j", jobs], check=True
    )
    return exe


def cpu_has_amx() -> bool:
    """llama.cpp's repacked (AMX) kernels fault in VMs that advertise AMX without handing
    its state to the guest; both servers then run without them (``-nr`` here,
    ``extra_buffers`` auto on milliserve's side)."""
    from milliserve.backends.llama_options import _cpu_has_amx

    return _cpu_has_amx()


class LlamaServer:
    """``llama-server`` on a free port; ``settings`` are extra command-line flags."""

    def __init__(
        self, gguf: Path, port: int, threads: int, parallel: int, n_ctx: int, *settings: str
    ) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.gguf, self.n_ctx, self.settings = gguf, n_ctx, settings
        self.threads, self.parallel = threads, parallel
        cmd = [str(binary()), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["-a", "smollm2", "-np", str(parallel), "-c", str(n_ctx * parallel), "-t", str(threads)]
        cmd += ["--no-webui", "--metrics", *(["-nr"] if cpu_has_amx() else []), *settings]
        self.cmd = cmd
        self.log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        # its shared libraries are beside it
        env = {**os.environ, "LD_LIBRARY_PATH": str(Path(cmd[0]).parent)}
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("wb"), stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError("llama-server did not start")

    def again(self) -> LlamaServer:
        """Another llama-server with the same settings, on a new port."""
        from milliserve.testing import free_port

        return LlamaServer(self.gguf, free_port(), self.threads, self.parallel, self.n_ctx, *self.settings)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


if __name__ == "__main__":
    print(binary())
