"""Stand-in for vllm.model_executor.model_loader.ep_weight_filter: which expert weights a rank
skips (vLLM 0.33's rule, as it is)."""

import re

_EXPERT_ID_RE = re.compile(r"\.experts\.(\d+)\.")


def parse_expert_id(weight_name):
    m = _EXPERT_ID_RE.search(weight_name)
    return int(m.group(1)) if m else None


def should_skip_weight(weight_name, local_expert_ids):
    if local_expert_ids is None:
        return False
    eid = parse_expert_id(weight_name)
    if eid is None:
        return False
    if not weight_name.endswith((".weight", ".weight_packed")):
        return False
    return eid not in local_expert_ids
