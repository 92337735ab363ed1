"""YAML as trainmaster writes it for people and for kubectl: one renderer for every manifest.

`launch --dry-run`, `data stage --dry-run` and every file of `cluster plan` print Kubernetes
objects and eksctl/CloudFormation/Helm documents the same way: keys in the order the builders
give them, block style, multi-line strings (user data, pod scripts) as literal blocks so they
read as they run, and no anchors or aliases (a value used twice is written twice, as kubectl
users expect).
"""

from __future__ import annotations

from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(
    docs: list[dict[str, Any]] | dict[str, Any], *, width: int = 100, comment: str = ""
) -> str:
    """Each document in turn, separated by `---`, after COMMENT's lines as `# ` comments."""
    items = docs if isinstance(docs, list) else [docs]
    body = "---\n".join(
        yaml.dump(d, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=width)
        for d in items
    )
    return "".join(f"# {line}\n" for line in comment.splitlines()) + body
