"""PyTorch distributed checkpoints (`torch.distributed.checkpoint`) of Hugging Face
safetensors files, read through this library.

```python
import torch.distributed.checkpoint as dcp
from safetensors_staging.dcp import StagingStorageReader

dcp.load(state_dict, storage_reader=StagingStorageReader("model_dir"))
```

`StagingStorageReader` is torch's `HuggingFaceStorageReader` (same metadata, same planner, same
checks) whose reads go through `safetensors_staging.safe_open`: each `ReadItem` of a rank's plan
is one `get_slice(name)[...]`, which reads only the rows of dimension 0 the item covers (an item
cut along an inner dimension reads the rows it spans), into memory on the device of the tensor
being loaded (through cuFile/hipFile for a GPU), then copied into it. `bytes_read` says what this
rank read.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

from torch.distributed.checkpoint import HuggingFaceStorageReader
from torch.futures import Future

from ._safe_open import safe_open

__all__ = ["StagingStorageReader"]


class StagingStorageReader(HuggingFaceStorageReader):
    """Torch's `HuggingFaceStorageReader`, reading through this library.

    Args:
        path: the directory of the checkpoint's `.safetensors` files (as for torch's reader).
        thread_count: files read at once (as for torch's reader).
        **options: this library's options for every file opened (`backend`, `memory_cap`,
            `chunk_size`, ...), as for `safe_open`.
    """

    def __init__(self, path: str, thread_count: int = 1, **options: Any) -> None:
        super().__init__(path, thread_count=thread_count)
        self._options = options
        self._lock = threading.Lock()
        self._bytes_read = 0
        self._tensors_read = 0

    @property
    def bytes_read(self) -> int:
        """Bytes this reader has read from storage, over every `read_data` so far."""
        return self._bytes_read

    @property
    def tensors_read(self) -> int:
        """Reads (one per `ReadItem`) made so far."""
        return self._tensors_read

    def _read_file(self, file_name: str, requests: List[Any], planner: Any) -> None:
        handles: Dict[str, safe_open] = {}
        try:
            for request in requests:
                target = planner.resolve_tensor(request).detach()
                device = str(target.device)
                handle = handles.get(device)
                if handle is None:
                    handle = handles[device] = safe_open(
                        file_name, framework="pt", device=device, **self._options
                    )
                index = tuple(
                    slice(offset, offset + length)
                    for offset, length in zip(request.storage_offsets, request.lengths)
                )
                tensor = handle.get_slice(request.storage_index.fqn)[index]
                if target.size() != tensor.size():
                    raise AssertionError(
                        f"req {request.storage_index} mismatch sizes {target.size()} vs {tensor.size()}"
                    )
                target.copy_(tensor)
                planner.commit_tensor(request, target)
        finally:
            for handle in handles.values():
                report = handle.report()
                handle.close()
                with self._lock:
                    self._bytes_read += int(report["bytes_read"])
                    self._tensors_read += int(report["tensors"])

    def read_data(self, plan: Any, planner: Any) -> Future[None]:
        """Reads every item of `plan` into the tensors `planner` resolves, file by file.

        Returns:
            A future already done; an error is raised here, the first file's (after the
            others ended).
        """
        per_file: Dict[str, List[Any]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(
                item
            )
        work = list(per_file.items())
        threads = min(self.thread_count, len(work))
        if threads <= 1:
            for file_name, requests in work:
                self._read_file(file_name, requests, planner)
        else:
            with ThreadPoolExecutor(threads, thread_name_prefix="staging-dcp") as pool:
                # `list` re-raises the first file's error, after the others ended.
                list(pool.map(lambda item: self._read_file(item[0], item[1], planner), work))
        done: Future[None] = Future()
        done.set_result(None)
        return done
