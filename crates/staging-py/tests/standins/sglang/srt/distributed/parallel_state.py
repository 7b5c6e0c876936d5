"""Stand-in for sglang.srt.distributed.parallel_state: the world group over torch.distributed's."""


class _Group:
    @property
    def cpu_group(self):
        import torch.distributed as dist

        return dist.group.WORLD

    device_group = cpu_group


def get_world_group():
    return _Group()
