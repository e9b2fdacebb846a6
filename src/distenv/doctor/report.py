"""The doctor's report: `Report` (the findings as they are added), the levels, the variables
shown, and the report's three forms: `render` (the human-readable text), `summary` (one line)
and `exit_code`."""

from __future__ import annotations

from ..core.redact import redact_text
from .versioninfo import PACKAGES

TYPE_CHECKING = False  # typing stays out of `import distenv` (mypy takes any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

LEVELS = ("error", "warning", "info", "ok")


def _launcher_prefixes() -> "tuple[str, ...]":
    from ..sources import prefixes  # every source names the variables it reads (`prefixes`)

    return prefixes()


#: Variables shown in the report (values redacted where secret): every launcher's and
#: platform's own (from the sources: the doctor keeps no list of them), then the communication
#: and threading libraries'.
SHOWN_PREFIXES = _launcher_prefixes() + (
    "NCCL_", "GLOO_", "UCX_", "FI_", "OMP_", "MKL_NUM", "OPENBLAS_NUM", "CUDA_VISIBLE",
    "HIP_VISIBLE", "ROCR_VISIBLE", "DISTENV_", "TORCH_DISTRIBUTED_",
)
#: Single names shown besides (none today: every launcher variable comes from a source).
SHOWN_NAMES: "frozenset[str]" = frozenset()


class Report:
    def __init__(self) -> None:
        self.findings: "list[dict[str, Any]]" = []  # level, topic, message, fix: JSON

    def add(self, level: str, topic: str, message: str, fix: "str | None" = None) -> None:
        self.findings.append({"level": level, "topic": topic, "message": redact_text(message),
                              "fix": redact_text(fix) if fix else None})


def exit_code(report: "Mapping[str, Any]") -> int:
    """2: the environment cannot be resolved (as every distenv command); 1: a finding is an
    error; 0 otherwise."""
    if report.get("error"):
        return 2
    return 1 if report["status"] == "error" else 0


def render(report: "Mapping[str, Any]") -> str:
    """The human-readable report."""
    from ..core.description import FIELDS

    from ..core.description import UNREVEALED
    from ..display import clip, hosts_text, shorten

    lines = ["launch"]
    if report["launch"] is not None:
        width = max(len(f) for f in FIELDS)
        for name in FIELDS:
            value = report["launch"][name]
            if name == "hosts" and value:
                value = hosts_text(value)
            elif isinstance(value, list):
                value = ",".join(map(str, value))
            shown = "unknown" if value is None else shorten(str(value))
            why = shorten(report["provenance"].get(name, UNREVEALED if value is None else ""))
            lines.append(f"  {name:<{width}}  {shown:<16}  {why}".rstrip())
    else:
        lines.append(f"  cannot be resolved: {clip(report['error'])}")
    if report.get("map") is not None:
        from ..nodemap import render as render_map

        lines.append("")
        lines.append("map (once for the job: distenv show --map)")
        lines += [f"  {line}" for line in render_map(report["map"]).split("\n")]
    lines.append("")
    lines.append("findings")
    for f in report["findings"]:
        lines.append(f"  [{f['level']}] {f['topic']}: {clip(f['message'])}")
        if f["fix"]:
            lines.append(f"      fix: {clip(f['fix'])}")
    if report.get("versions"):
        v = report["versions"]
        lines.append("")
        lines.append("versions")
        rows = [("distenv", v["distenv"]), ("python", v["python"]), *v["packages"].items()]
        if v.get("launcher"):
            launcher = v["launcher"]
            rows.append((f"launcher ({launcher['name']})",
                         f"{launcher['version'] or 'unknown'}  [{launcher['source']}]"))
        missing = [p for p in PACKAGES if p not in v["packages"]]
        if missing:
            rows.append(("not installed", ", ".join(missing)))
        width = max(len(name) for name, _ in rows)
        lines += [f"  {name:<{width}}  {shorten(value)}" for name, value in rows]
    if report.get("probe"):
        lines.append("")
        p = report["probe"]
        lines.append(f"probe  {p.get('address')}:{p.get('port')} -> {p.get('result')}")
    lines.append("")
    lines.append("environment (secret values redacted)")
    if report["environment"]:
        for name, value in report["environment"].items():
            lines.append(f"  {name}={shorten(value)}")
    else:
        lines.append("  (no launcher, collective or thread variables set)")
    lines.append("")
    counts = {level: sum(1 for f in report["findings"] if f["level"] == level) for level in LEVELS}
    lines.append(f"{counts['error']} error(s), {counts['warning']} warning(s)")
    return "\n".join(lines)


def summary(report: "Mapping[str, Any]") -> str:
    """One line: status, counts, the first error (else warning) and its fix."""
    from ..display import MAX_VALUE, clip

    counts = {level: sum(1 for f in report["findings"] if f["level"] == level) for level in LEVELS}
    line = f"doctor: {report['status']}: {counts['error']} error(s), {counts['warning']} warning(s)"
    worst = next((f for f in report["findings"] if f["level"] in ("error", "warning")), None)
    if worst is not None:
        line += f"; {worst['topic']}: {clip(worst['message'], MAX_VALUE, 'distenv doctor')}"
        if worst["fix"]:
            line += f" Fix: {clip(worst['fix'], MAX_VALUE, 'distenv doctor')}"
    return line
