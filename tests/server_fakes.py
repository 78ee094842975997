"""Fake SGLang server scripts for the watchdog tests (printed start-up lines, then a
hang, a crash, an ignored SIGTERM or a clean exit)."""

from pathlib import Path

import psutil

#: SGLang's start-up lines (texts from sgl-project/sglang python/sglang/srt/
#: model_executor/model_runner.py, entrypoints/http_server.py), printed with live stamps.
_PRELUDE = '''
import datetime, faulthandler, signal, subprocess, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)

def log(msg, tag=" TP0"):
    ts = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{ts}{tag}] {msg}", flush=True)

log("server_args=ServerArgs(model_path='fake/Llama-3.1-8B', tp_size=1, port=30000)", tag="")
log("Attention backend not specified. Use fa3 backend by default.", tag="")
log("Init torch distributed begin.")
log("Load weight begin. avail mem=78.50 GB")
log("Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.40 GB, "
    "mem usage=15.10 GB.")
log("Capture cuda graph begin. This can take up to several minutes. avail mem=10.20 GB")
'''

HUNG = _PRELUDE + '''
# a second group member, like a scheduler rank
rank = subprocess.Popen([sys.executable, "-c",
    "import time\\ndef wait_for_nccl_peer():\\n    time.sleep(600)\\nwait_for_nccl_peer()"])

def capture_cuda_graph():
    time.sleep(600)

capture_cuda_graph()
'''

CRASHED = _PRELUDE + '''
def capture_cuda_graph():
    raise RuntimeError("CUDA error: out of memory (fake)")

capture_cuda_graph()
'''

STUBBORN = '''
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ignoring SIGTERM", flush=True)
time.sleep(600)
'''

CLEAN_EXIT = '''
print("nothing to do", flush=True)
'''


def processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and text in " ".join(
                    p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


def read(path: Path) -> str:
    return Path(path).read_text(errors="replace")
