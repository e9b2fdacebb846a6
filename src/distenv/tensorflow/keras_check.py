"""Which Keras `tf.keras` is, and whether it can train under MultiWorkerMirroredStrategy;
whether TensorFlow already fixed its devices."""

from __future__ import annotations

import sys

from .cluster import _environ

TYPE_CHECKING = False  # mypy takes any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

#: Where a Keras 3 user goes instead (another backend, not another Keras).
JAX_PATH = ("or use Keras 3 on the JAX backend: distenv.keras.initialize() / see "
            "docs/frameworks/jax.md")


def tf_initialized() -> bool:
    """True once TensorFlow created its eager context (devices are fixed from then on)."""
    if "tensorflow" not in sys.modules:
        return False
    try:
        from tensorflow.python.eager import context
    except ImportError:  # pragma: no cover - a very different TensorFlow
        return False
    ctx = context.context_safe()
    return ctx is not None and bool(getattr(ctx, "_initialized", False))


def keras_flavour(environ: "Mapping[str, str] | None" = None) -> "tuple[str, str]":
    """(flavour, why): which Keras `tf.keras` is, or will be: 'tf_keras', 'keras_3', 'keras_2'."""
    import importlib.util
    from importlib import metadata

    src = _environ(environ)
    legacy = src.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1")
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        loader: Any = tf.__dict__.get("keras")
        if getattr(loader, "_tfll_initialized", False):
            return loader._tfll_keras_version or "none", "tf.keras is already loaded"
        at_import = tf.__dict__.get("_tf_uses_legacy_keras")
        if at_import is not None and at_import != legacy:
            return "mixed", (f"TF_USE_LEGACY_KERAS={src.get('TF_USE_LEGACY_KERAS')!r} now, but "
                             f"{'set' if at_import else 'unset'} when TensorFlow was imported")
    try:
        tf_version = metadata.version("tensorflow-cpu")
    except metadata.PackageNotFoundError:
        try:
            tf_version = metadata.version("tensorflow")
        except metadata.PackageNotFoundError:
            tf_version = "0"
    if legacy:
        if importlib.util.find_spec("tf_keras") is None:
            return "missing", "TF_USE_LEGACY_KERAS=1 but tf-keras is not installed"
        return "tf_keras", "TF_USE_LEGACY_KERAS=1 and tf-keras installed"
    try:
        major_minor = tuple(int(x) for x in tf_version.split(".")[:2])
    except ValueError:
        major_minor = (0, 0)
    if (2, 0) <= major_minor < (2, 16):
        return "keras_2", f"TensorFlow {tf_version} ships Keras 2 as tf.keras"
    try:
        kv = metadata.version("keras")
    except metadata.PackageNotFoundError:
        return "none", "no keras installed"
    return ("keras_3" if kv.startswith("3.") else "keras_2"), \
        f"TensorFlow {tf_version} without TF_USE_LEGACY_KERAS=1: tf.keras is keras {kv}"


def keras_problem(environ: "Mapping[str, str] | None" = None, *, opt_in: str = "pass allow_keras3=True"
                  ) -> "str | None":
    """Why Keras would fail under MultiWorkerMirroredStrategy here, with the fix (or None).

    `opt_in`: how the caller lets a custom-loop user through (named in the fix)."""
    if "tf_keras" in sys.modules:
        return None  # the user trains with tf-keras directly
    flavour, why = keras_flavour(environ)
    imported: Any = sys.modules.get("keras")
    if flavour == "tf_keras" and str(getattr(imported, "__version__", "")).startswith("3."):
        flavour, why = "keras_3", f"keras {imported.__version__} (Keras 3) is imported, tf_keras is not"
    if flavour in ("tf_keras", "keras_2", "none"):
        return None
    fix = ("Fix: pip install 'tf-keras~=<TensorFlow major.minor>.0' --no-deps and set "
           "TF_USE_LEGACY_KERAS=1 before TensorFlow is imported (or `import tf_keras as keras`); "
           f"or train with a custom strategy.run loop and {opt_in}.")
    if flavour == "missing":
        return f"{why}: tf.keras would fail to load. {fix}"
    if flavour == "mixed":
        return f"{why}: tf.keras and tensorflow.keras imports would disagree. {fix}"
    return (f"Keras 3 with MultiWorkerMirroredStrategy: model.fit fails there "
            f"(keras-team/keras#20585) and Keras 3 callbacks know no chief ({why}). "
            f"{fix[:-1]}; {JAX_PATH}.")

