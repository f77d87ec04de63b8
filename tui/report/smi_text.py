"""``anatomy-top --once``: nvidia-smi's familiar default view as plain text, plus a host line.

Same column headers and three rows per GPU as nvidia-smi (the 550-driver layout, 91 columns), "N/A"
exactly where a value is N/A, "ERR!" where a GPU is lost. Text from processes (command lines) is printed
verbatim except control characters, which become '?' so a command line cannot drive the terminal.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tui import __version__, sanitize
from tui.sources.model import GpuInfo, GpuProcess, HostInfo, MachineSnapshot

WIDTH = 91
INNER = WIDTH - 2
NA = "N/A"
ERR = "ERR!"
MIB = 1 << 20
GIB = 1 << 30
_COLS = (41, 24, 22)
_NAME_W = 39  # process name column
_COMPUTE_MODE_SHORT = {
    "Default": "Default",
    "Exclusive_Process": "E. Process",
    "Exclusive_Thread": "E. Thread",
    "Prohibited": "Prohibited",
}


def clean(text: object) -> str:
    """Untrusted text safe to print on one line: the one sanitiser's visible escapes (``\\x1b``, ``\\n``)."""
    return sanitize.clean(str(text))


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


def _box(inner: str) -> str:
    return "|" + _fit(inner, INNER).ljust(INNER) + "|"


def _row(c1: str, c2: str, c3: str) -> str:
    w1, w2, w3 = _COLS
    return f"|{_fit(c1, w1):<{w1}}|{_fit(c2, w2):<{w2}}|{_fit(c3, w3):<{w3}}|"


def _rule(fill: str = "-", joint: str = "+", ends: str = "+") -> str:
    return ends + joint.join(fill * w for w in _COLS) + ends


def _full_rule(fill: str = "-", ends: str = "+") -> str:
    return ends + fill * INNER + ends


def mib(n: int | None) -> str:
    return NA if n is None else f"{n // MIB}MiB"


def watts(w: float | None) -> str:
    return NA if w is None else f"{round(w)}W"


def _on_off(v: bool | None) -> str:
    return NA if v is None else ("On" if v else "Off")


def _pct(v: int | float | None) -> str:
    return NA if v is None else f"{round(v)}%"


def _gpu_rows(g: GpuInfo) -> list[str]:
    if g.lost:
        return [
            _row(f"{g.index:>4}  {ERR:<28} {ERR:>4}  ", f"{ERR:>18} {ERR:>4} ", f"{ERR:>21} "),
            _row(f" {ERR:<4} {ERR:>4}    {ERR:<4} {ERR + ' / ' + ERR:>20} ", f"{ERR:>22} ", f"{ERR:>21} "),
            _row("", "", f"{ERR:>21} "),
        ]
    name = _fit(clean(g.name) if g.name is not None else NA, 28)
    temp = NA if g.temperature_c is None else f"{g.temperature_c}C"
    perf = NA if g.performance_state is None else f"P{g.performance_state}"
    fan = NA if g.fan_percent is None else f"{g.fan_percent}%"
    power = f"{watts(g.power_w):>5} / {watts(g.power_limit_w):>5}"
    memory = f"{mib(g.memory_used):>11} / {mib(g.memory_total):>9} "
    ecc = NA if g.ecc_volatile_uncorrected is None else str(g.ecc_volatile_uncorrected)
    compute = NA if g.compute_mode is None else _COMPUTE_MODE_SHORT.get(g.compute_mode, g.compute_mode)
    mig = NA if g.mig_mode is None else ("Enabled" if g.mig_mode else "Disabled")
    return [
        _row(
            f"{g.index:>4}  {name:<28} {_on_off(g.persistence_mode):>4}  ",
            f"{clean(g.bus_id) if g.bus_id else NA:>19} {_on_off(g.display_active):>3} ",
            f"{ecc:>21} ",
        ),
        _row(
            f" {fan:<4} {temp:>4}    {perf:<4}{power:>22} ", memory, f"{_pct(g.gpu_util):>7}  {compute:>12} "
        ),
        _row("", "", f"{mig:>21} "),
    ]


def gpu_table(machine: MachineSnapshot, tool: str = "anatomy-top") -> list[str]:
    nvml = machine.nvml
    head = (
        f" {tool:<33}Driver Version: {nvml.driver_version or NA:<15}"
        f"CUDA Version: {nvml.cuda_driver_version or NA:<9}"
    )
    lines = [_full_rule(), _box(head)]
    between = _rule()
    if not nvml.available:
        lines += [
            _full_rule(),
            _box(f" No GPU shown: {clean(nvml.reason or 'NVML unavailable')}"),
            _full_rule(),
        ]
        return lines
    if not machine.gpus:
        lines += [_full_rule(), _box(" No devices were found"), _full_rule()]
        return lines
    lines += [
        "|" + "+".join("-" * w for w in _COLS) + "+",
        _row(
            " GPU  Name                 Persistence-M ", " Bus-Id          Disp.A ", " Volatile Uncorr. ECC "
        ),
        _row(
            " Fan  Temp   Perf          Pwr:Usage/Cap ", "           Memory-Usage ", " GPU-Util  Compute M. "
        ),
        _row("", "", "               MIG M. "),
        _rule("=", "+", "|"),
    ]
    for g in machine.gpus:
        lines += _gpu_rows(g)
        lines.append(between)
    for g in machine.gpus:
        if g.lost:
            lines.append(f"GPU {g.index}: lost ({clean(g.error or 'unreachable')})")
    return lines


def process_label(p: GpuProcess) -> str:
    """What the "Process name" column shows: the command line, else the name, else N/A."""
    return clean(p.command or p.name or NA)


def _proc_line(gpu: str, gi: str, ci: str, pid: str, typ: str, name: str, mem: str) -> str:
    return _box(
        f" {gpu:>4}   {gi:<3}  {ci:<3}  {pid:>9}  {typ:>5}   {_fit(name, _NAME_W):<{_NAME_W}}  {mem:>10} "
    )


def _id(v: int | None) -> str:
    return NA if v is None else str(v)


def process_table(machine: MachineSnapshot) -> list[str]:
    lines = [
        _full_rule(),
        _box(" Processes:"),
        _proc_line("GPU", "GI", "CI", "PID", "Type", "Process name", "GPU Memory"),
        _proc_line("", "ID", "ID", "", "", "", "Usage     "),
        _full_rule("=", "|"),
    ]
    if not machine.processes:
        lines.append(_box("  No running processes found"))
    for p in sorted(machine.processes, key=lambda p: (p.gpu_index, p.pid)):
        lines.append(
            _proc_line(
                str(p.gpu_index),
                _id(p.gpu_instance_id),
                _id(p.compute_instance_id),
                str(p.pid),
                p.type,
                process_label(p),
                mib(p.gpu_memory),
            )
        )
    lines.append(_full_rule())
    return lines


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return NA
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d{hours:02d}h"
    return f"{hours}:{minutes:02d}:{s:02d}"


def _host_bytes(n: int | None) -> str:
    if n is None:
        return NA
    return f"{n / GIB:.1f}GiB" if n >= GIB else f"{n // MIB}MiB"


def process_details(machine: MachineSnapshot) -> list[str]:
    """The host's view of each GPU process (nvidia-smi has none): user, CPU, RSS, age, command."""
    if not machine.processes:
        return []
    lines = [f"{'PID':>9} {'USER':<12} {'GPU':>3} {'CPU%':>6} {'HOST-MEM':>9} {'TIME':>9}  COMMAND"]
    for p in sorted(machine.processes, key=lambda p: (p.gpu_index, p.pid)):
        cpu = NA if p.cpu_percent is None else f"{p.cpu_percent:.1f}"
        command = process_label(p) if p.alive else f"{NA} (process not found on this host)"
        user = _fit(clean(p.user), 12) if p.user is not None else NA
        lines.append(
            f"{p.pid:>9} {user:<12} {p.gpu_index:>3} {cpu:>6} {_host_bytes(p.host_rss):>9} "
            f"{_duration(p.running_time_s):>9}  {command}"
        )
    return lines


def host_line(host: HostInfo) -> str:
    cpu = NA if host.cpu_percent is None else f"{host.cpu_percent:.1f}%"
    cores = NA if host.cpu_count is None else str(host.cpu_count)
    load = NA if host.load_avg is None else " ".join(f"{x:.2f}" for x in host.load_avg)
    memory = f"{_host_bytes(host.memory_used)} / {_host_bytes(host.memory_total)}"
    swap = f"{_host_bytes(host.swap_used)} / {_host_bytes(host.swap_total)}"
    name = clean(host.hostname) if host.hostname else NA
    return f"Host {name}: {cores} CPUs, CPU {cpu}, load {load}, memory {memory}, swap {swap}"


def tool_version() -> str:
    # tui.__version__, not importlib.metadata: that import alone costs --once ~8 ms.
    return __version__


def _tool_name() -> str:
    return f"anatomy-top {tool_version()}"


def render_text(
    machine: MachineSnapshot,
    training: str | Sequence[str] | None = None,
    *,
    tool: str | None = None,
    details: bool = True,
) -> str:
    """The whole ``--once`` text: time, GPU table, process table, host line, process details, and the
    pre-rendered ``training`` blocks (the anatomy of each publishing process) appended verbatim."""
    lines = [time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(machine.time))]
    lines += gpu_table(machine, tool or _tool_name())
    if machine.nvml.available and machine.gpus:
        lines.append(" " * WIDTH)
        lines += process_table(machine)
    lines.append(host_line(machine.host))
    if details:
        lines += process_details(machine)
    blocks = [training] if isinstance(training, str) else list(training or ())
    lines += [b.rstrip("\n") for b in blocks if b]
    return "\n".join(lines) + "\n"
