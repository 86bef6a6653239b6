"""The C ABI (include/unimoe/unimoe_c.h) through ctypes.

The shared library is found next to this file (where `pip install` puts it)
or at the path in UNIMOE_LIBRARY, read once at import (for running the tests
against a CMake build tree). Every C function returns a status; check()
turns a failing one into the Python exception of its kind.
"""

import ctypes
import os

_OK, _ERROR_VALUE, _ERROR_RUNTIME, _ERROR_UNSUPPORTED = 0, 1, 2, 3
ABI_VERSION = 3


class Error(ValueError):
    """An impossible value, as unimoe::Error: `field` names what was refused."""

    def __init__(self, message, field=""):
        super().__init__(message)
        self.field = field


class Weights(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "w13", "w2", "b13", "b2", "w13_scale", "w2_scale", "x_scale", "act_scale",
        "w13_block_scale", "w2_block_scale")] + [("w13_interleaved", ctypes.c_int)]


def _library_path():
    given = os.environ.get("UNIMOE_LIBRARY")
    if given:
        return given
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libunimoe_c.so")


def _load():
    path = _library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(
            f"unimoe: cannot load its C library {path}: {e}. Install the package with "
            "`pip install .` from the repository, or point UNIMOE_LIBRARY at a built "
            "libunimoe_c.so") from e
    p, i, s, vp = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p
    out_str = ctypes.POINTER(ctypes.c_char_p)
    signatures = {
        "unimoe_abi_version": ([], i),
        "unimoe_version": ([], s),
        "unimoe_has_cuda": ([], i),
        "unimoe_last_error": ([], s),
        "unimoe_last_error_field": ([], s),
        "unimoe_config_normalize": ([s, i, out_str], i),
        "unimoe_config_from_hf_json": ([s, out_str], i),
        "unimoe_layer_create": ([s, i, ctypes.POINTER(p)], i),
        "unimoe_layer_scratch_bytes": ([s, i, ctypes.POINTER(ctypes.c_size_t)], i),
        "unimoe_layer_create_with_scratch": ([s, i, vp, ctypes.c_size_t, ctypes.POINTER(p)], i),
        "unimoe_layer_destroy": ([p], None),
        "unimoe_layer_set_weights": ([p, ctypes.POINTER(Weights)], i),
        "unimoe_layer_forward": ([p, i, vp, vp, vp, vp, vp, vp, vp], i),
        "unimoe_layer_describe": ([p, i, out_str], i),
        "unimoe_layer_workspace_bytes": ([p, ctypes.POINTER(ctypes.c_size_t)], i),
        "unimoe_layer_use_tuning_cache": ([p, s, out_str], i),
        "unimoe_layer_autotune": ([p, ctypes.POINTER(i), i, s, i, i, s, i, out_str], i),
        "unimoe_ref_forward": ([s, i, vp, vp, vp, vp, vp, ctypes.POINTER(Weights), vp, i], i),
        "unimoe_nccl_support": ([out_str], i),
        "unimoe_nccl_unique_id": ([vp, ctypes.c_size_t], i),
        "unimoe_ep_create": ([s, i, vp, ctypes.c_size_t, i, i, ctypes.POINTER(p)], i),
        "unimoe_ep_scratch_bytes": ([s, i, i, ctypes.POINTER(ctypes.c_size_t)], i),
        "unimoe_ep_create_with_scratch": ([s, i, vp, ctypes.c_size_t, i, i, vp, ctypes.c_size_t,
                                           ctypes.POINTER(p)], i),
        "unimoe_ep_destroy": ([p], None),
        "unimoe_ep_set_weights": ([p, ctypes.POINTER(Weights)], i),
        "unimoe_ep_forward": ([p, i, vp, vp, vp, vp, vp, vp, vp], i),
        "unimoe_ep_local_layer": ([p, ctypes.POINTER(p)], i),
        "unimoe_ep_bytes": ([p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)], i),
    }
    for name, (args, res) in signatures.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = res
    if lib.unimoe_abi_version() != ABI_VERSION:
        raise ImportError(f"unimoe: {path} has C ABI version {lib.unimoe_abi_version()}; "
                          f"this package needs {ABI_VERSION}")
    return lib


lib = _load()


def check(status):
    """Raises the exception of a failing status: Error (a ValueError naming
    the field) for a bad value, RuntimeError for the device or runtime."""
    if status == _OK:
        return
    message = lib.unimoe_last_error().decode()
    field = lib.unimoe_last_error_field().decode()
    if status == _ERROR_VALUE:
        raise Error(message, field)
    raise RuntimeError(message)


def call_str(fn, *args):
    """Calls a function that returns a string through its last argument."""
    out = ctypes.c_char_p()
    check(fn(*args, ctypes.byref(out)))
    return out.value.decode()


def has_cuda():
    """Whether this build has the GPU layer (it was built where nvcc was found)."""
    return bool(lib.unimoe_has_cuda())


def version():
    return lib.unimoe_version().decode()
