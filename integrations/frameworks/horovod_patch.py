#!/usr/bin/env python3
"""Apply the minimal compatibility edits (and one build setting) to an unpacked Horovod 0.28.1
PyPI sdist.

    python integrations/frameworks/horovod_patch.py /path/to/horovod-0.28.1

Horovod 0.28.1 (2023, the last release) does not build against today's frameworks as is
(measured; see docs/frameworks/horovod.md#building-horovod-0281):

1. torch 2.x headers need C++17, but the top-level and horovod/torch CMake files ask for
   C++14 and third_party/gloo adds -std=c++11; mixing the standards breaks the link on
   gloo::rendezvous::Store::kDefaultTimeout. Everything is set to C++17.
2. With TensorFlow >= 2.16, horovod/tensorflow/xla_mpi_ops.cc fails on missing highwayhash
   headers pulled in by the XLA includes. Its XLA ops only serve GPU builds, so the whole
   XLA part is guarded with (HAVE_CUDA || HAVE_ROCM). (Harmless for a torch-only build.)
3. horovod.tensorflow.keras (and its callbacks) import `keras.backend`, which is Keras 3 and
   breaks under tf-keras; they are made to use tf.keras.backend, which is tf-keras whenever
   TF_USE_LEGACY_KERAS=1. (Python only; harmless for a torch-only build.)

And one build setting, for the machines that build it to test distenv (not a fix): the C and
C++ are compiled at -O0 without debug information instead of RelWithDebInfo's -O3 -g (which
CMakeLists.txt forces after any CXXFLAGS). Measured here, the same sdist and venv, -j2: 292 s
and 533 CPU-s at -O3 -g, 179 s and 309 CPU-s at -O0; the compile is the critical path of
integrations/setup.sh. The tests move tensors of a few numbers, where the C++'s speed does
not show.

This edits the unpacked sdist in place and nothing else. Every edit checks that it found
exactly the text it expects, so a different Horovod version fails loudly instead of being
half-patched. Running it twice is a no-op (each edit recognises its own result).
"""
from __future__ import annotations

import sys
from pathlib import Path

EDITS = [
    # (file, old, new)
    ("CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"),
    ("horovod/torch/CMakeLists.txt", "    set(CMAKE_CXX_STANDARD 14)", "    set(CMAKE_CXX_STANDARD 17)"),
    ("third_party/gloo/CMakeLists.txt", '-std=c++11 -fPIC")', '-std=c++17 -fPIC")'),
    ("horovod/tensorflow/xla_mpi_ops.cc",
     "#if TENSORFLOW_VERSION >= 2006000000\n",
     "#if TENSORFLOW_VERSION >= 2006000000 && (HAVE_CUDA || HAVE_ROCM)  // distenv: XLA ops are GPU-only\n"),
    ("horovod/tensorflow/keras/__init__.py",
     "    from keras import backend as K\n",
     "    K = tf.keras.backend  # distenv: tf-keras under TF_USE_LEGACY_KERAS=1\n"),
    ("horovod/tensorflow/keras/callbacks.py",
     "    from keras import backend as K\n",
     "    K = tf.keras.backend  # distenv: tf-keras under TF_USE_LEGACY_KERAS=1\n"),
    ("CMakeLists.txt",
     'string(REPLACE "-O2" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO "${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")\n',
     'set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O0 -DNDEBUG")  # distenv: a quick build for tests\n'),
    ("CMakeLists.txt",
     'string(REPLACE "-O2" "-O3" CMAKE_C_FLAGS_RELWITHDEBINFO "${CMAKE_C_FLAGS_RELWITHDEBINFO}")\n',
     'set(CMAKE_C_FLAGS_RELWITHDEBINFO "-O0 -DNDEBUG")  # distenv: a quick build for tests\n'),
]


def apply(root: Path) -> int:
    changed = 0
    for rel, old, new in EDITS:
        path = root / rel
        text = path.read_text()
        if new in text and old not in text.replace(new, ""):
            continue  # already applied
        count = text.count(old)
        if count != 1:
            raise SystemExit(f"horovod_patch: expected exactly one {old!r} in {rel}, found {count}: "
                             "not the Horovod 0.28.1 sdist this patch was written for")
        path.write_text(text.replace(old, new))
        changed += 1
        print(f"horovod_patch: {rel}: {old.strip()!r} -> {new.strip()!r}", file=sys.stderr)
    return changed


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    root = Path(sys.argv[1])
    if not (root / "horovod" / "__init__.py").is_file():
        raise SystemExit(f"horovod_patch: {root} is not an unpacked Horovod sdist")
    apply(root)
