"""Stand-in for sglang.srt.arg_groups.choices: the list `--load-format` accepts, extensible."""

from sglang.srt.configs.load_config import LoadFormat

LOAD_FORMAT_CHOICES = [format.value for format in LoadFormat]


def add_load_format_choices(iterable):
    LOAD_FORMAT_CHOICES.extend(iterable)
