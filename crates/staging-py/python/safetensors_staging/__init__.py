"""Load safetensors checkpoints onto a GPU (cuFile, hipFile) or into host memory.

Bounded memory and exact bytes; tensors handed to PyTorch and NumPy through DLPack, zero-copy.
Every tensor owns its memory: dropping its last reference gives it back to the library.

`safetensors_staging.torch`, `.numpy` and `.flax` have the functions of `safetensors.torch`,
`.numpy` and `.flax`: code written for `safetensors` switches by changing its import.

Example:
    ```python
    import safetensors_staging as st

    weights = st.load_file("model_dir", device="cuda:0")  # dict[str, torch.Tensor]
    for name, tensor in (it := st.stage("model_dir", device="cuda:0")):
        ...  # vLLM-style weight iterator
    print(it.report()["bytes_read"])
    with st.open("model_dir") as ckpt:  # metadata, nothing loaded
        print(ckpt.keys(), ckpt["lm_head.weight"].shape, ckpt.metadata())
    with st.safe_open("model.safetensors", framework="pt", device="cuda:0") as f:
        w = f.get_slice("lm_head.weight")[0:512]  # safetensors' API; reads 512 rows
    ```
"""

# Everything is decided by the Rust library's one entry point (`safetensors_staging::Loader`),
# as for the `stage` command: the backend (`auto`: cuFile, then hipFile), the staging policy (a
# tensor goes into its own device buffer when free memory leaves headroom, else it is assembled
# in host memory through one bounded staging buffer), and what a read error means (an exception
# naming the tensor, file and offset; nothing half-read is handed out). The modules:
#   _load       stage, load_file, open, Stage, describe_options
#   _safe_open  safe_open (safetensors' API); _slicing: safe_slice and the rows an index needs
#   _convert    loaded tensors as torch's, NumPy's, JAX's; _dtypes: the dtype table's views
#   _device     device spellings; _serialize: saving and parsing a file's bytes
#   _raw        safetensors' raw API: TensorSpec, serialize, serialize_file, deserialize
#   _requires   the ImportError that names the extra to install where torch or JAX is missing
#   _distributed  loads across a torch.distributed group; _engines: the vLLM/SGLang plumbing

from ._load import PathLike as PathLike  # the types of `path` and `rows`, for annotations
from ._load import Paths as Paths
from ._load import RowSpec as RowSpec
from ._load import Stage, describe_options, load_file, open, stage
from ._load_into import LoadIntoError, MismatchError, PartialLoadError
from ._native import (
    BackendUnavailableError,
    Checkpoint,
    DestinationError,
    DeviceError,
    InvalidOptionError,
    MalformedCheckpointError,
    OutOfMemoryError,
    PathNotFoundError,
    PathPermissionError,
    ReadError,
    ResourceError,
    SelectionError,
    StagingError,
    TensorInfo,
    UnsupportedDtypeError,
    __version__,
)
from ._raw import TensorSpec, deserialize, serialize, serialize_file
from ._safe_open import SafetensorError, safe_open
from ._safe_open import _safe_open_handle as _safe_open_handle  # safetensors' (private) name
from ._slicing import safe_slice

__all__ = [
    "BackendUnavailableError",
    "Checkpoint",
    "DestinationError",
    "DeviceError",
    "InvalidOptionError",
    "LoadIntoError",
    "MalformedCheckpointError",
    "MismatchError",
    "OutOfMemoryError",
    "PartialLoadError",
    "PathNotFoundError",
    "PathPermissionError",
    "ReadError",
    "ResourceError",
    "SafetensorError",
    "SelectionError",
    "Stage",
    "StagingError",
    "TensorInfo",
    "TensorSpec",
    "UnsupportedDtypeError",
    "__version__",
    "describe_options",
    "deserialize",
    "load_file",
    "open",
    "safe_open",
    "safe_slice",
    "serialize",
    "serialize_file",
    "stage",
]
