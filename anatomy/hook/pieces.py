"""A sampled step's instrument over a piece of a deep model's step, so that no step is held up by more than
about its own duration.

The op-group profiler and the per-op memory trace are dispatch modes: every op run inside them costs a
few microseconds more, a few times a small op's own time — over a whole step of a model of a hundred small
layers, a second added to a 0.2 s step. A model whose forward runs a stack of repeated blocks (the
children of its longest ``ModuleList``/``Sequential`` of one class: Hugging Face's decoder layers, an
MLP's blocks) is instrumented in pieces, one piece a step over consecutive steps: a run of consecutive
blocks — the first piece from the model's forward start, the last to its end — with the backward ops of
the autograd nodes that run's forward made, then the optimizer's step as a piece of its own. The steps
repeat the same shapes, so the pieces' figures add up to one step's: op groups and the traced peak stand
for the whole step once every piece has run (on the step that completed them). Ops run after the
model's forward and before its backward (a loss computed in the loop) fall in no piece.

The mode is pushed only while a piece's ops run: by forward pre-hooks on the blocks at the piece's ends
(the model's own hooks at its forward's start and end), and in backward by a pre-hook on each of the
piece's autograd nodes (found from the piece's outputs by their sequence numbers, as the piece's forward
ends). Autograd runs every node under the thread state of the ``backward()`` call, restored as the node
is done: only a hook inside the node can switch a mode on for it, and the restore switches it off again
after the node's function and the sums of the gradients it passes on. Nothing here changes a value: every
hook returns None, and all of them are removed when the step ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from time import perf_counter
from typing import Any

import torch
from torch.autograd.graph import get_gradient_edge
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# A shorter stack is instrumented whole. Pieces are for deep stacks, where a whole step under an instrument
# is held up by more than its own duration; in pieces (a run of blocks a step, then the optimizer on a
# step of its own) a 4-layer Llama's first trace was complete only on step 5, after a 4-step job ended.
MIN_BLOCKS = 8
_MARK = "anatomy-top: held?"  # (a gradient accumulator's metadata key, for as long as held_accumulators asks)
_SEQUENCE_NR: Callable[[], int] | None = getattr(torch._C._autograd, "_get_sequence_nr", None)
# Pushes a mode on the dispatch stack and nothing else (TorchDispatchMode.__enter__ keeps Python-side
# flags its __exit__ restores; in a node, autograd's own restore takes the mode off, not an __exit__).
_PUSH: Callable[[Any], None] | None = getattr(torch._C, "_push_on_torch_dispatch_stack", None)


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The children of the model's longest ``ModuleList``/``Sequential`` whose children are all of one
    class, in order (at least ``MIN_BLOCKS``; else none: the step is instrumented whole)."""
    best: list[torch.nn.Module] = []
    for module in model.modules():
        if not isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        kids = list(module.children())
        if len(kids) > len(best) and len({type(k) for k in kids}) == 1:
            best = kids
    return best if len(best) >= MIN_BLOCKS and _SEQUENCE_NR is not None and _PUSH is not None else []


def _grad_fns(value: Any, out: list[Any], depth: int = 4) -> None:
    """The autograd nodes that made the tensors in ``value`` (tensors, and tuples, lists and dicts of them:
    a block's arguments, a model's output)."""
    if isinstance(value, torch.Tensor):
        fn = value.grad_fn
        if fn is not None:
            out.append(fn)
    elif depth > 0 and isinstance(value, (tuple, list)):
        for v in value:
            _grad_fns(v, out, depth - 1)
    elif depth > 0 and isinstance(value, dict):
        for v in value.values():
            _grad_fns(v, out, depth - 1)


def held_accumulators(params: Iterable[torch.Tensor]) -> frozenset[int]:
    """``id()`` of the parameters whose gradient accumulator something holds now (DDP's reducer, a graph
    still alive): asked for, marked and let go, an accumulator nobody else holds is gone, and the next one
    asked for is new; a held one comes back with its mark."""
    held = []
    for p in params:
        try:
            if not isinstance(p, torch.Tensor) or not p.requires_grad or p.grad_fn is not None:
                continue
            node: Any = get_gradient_edge(p).node  # (its metadata: a dict, whatever the stubs say)
            node.metadata[_MARK] = True
            del node
            node = get_gradient_edge(p).node
            if node.metadata.pop(_MARK, False):
                held.append(id(p))
            del node
        except Exception:  # (a tensor type autograd gives no accumulator here: nothing to hook either)
            continue
    return frozenset(held)


class _Window(TorchFunctionMode):
    """Counts the torch calls of the optimizer's step, and runs those in its piece's window under the
    piece's dispatch mode: on from the window's first call (one push, not one a call) until its calls
    have taken the piece's ``window_s``, or the optimizer's step ends."""

    def __init__(self, piece: Piece) -> None:
        super().__init__()
        self.piece = piece

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        piece = self.piece
        index = piece.calls
        piece.calls = index + 1
        if index < piece.call_first or piece.call_stop is not None or not piece._live:
            return func(*args, **kwargs) if kwargs else func(*args)
        if not piece._pushed:  # the window opens (again, for a second optimizer's step)
            piece.opened_at = perf_counter()
            piece._push()
        try:
            out = func(*args, **kwargs) if kwargs else func(*args)
        except BaseException:
            piece.window_closes()  # (nothing of the user's, handling it, runs under the mode)
            raise
        if piece.window_used + perf_counter() - piece.opened_at >= piece.window_s:
            piece.window_closes()
            piece.call_stop = index + 1
        return out


class Piece:
    """One sampled step's piece: ``mode`` (a dispatch mode: the profiler or the trace) over blocks
    ``first`` to ``stop`` of ``blocks`` (0 to ``len(blocks)``: the model's whole forward), forward and
    backward, or over the optimizer's step (``optimizer=True``): its torch calls from ``call_first`` on,
    until they have taken ``window_s`` (then ``call_stop`` is where the next window starts; None: the
    window ran to the step's end), or the whole step (``window_s`` infinite: no function mode).
    ``open()`` as the step begins, the tracker's ``model_begins``/``model_ends``/``optimizer_begins``/
    ``optimizer_ends`` at those boundaries, ``close()`` as it ends."""

    def __init__(
        self,
        mode: TorchDispatchMode,
        blocks: list[torch.nn.Module],
        first: int,
        stop: int,
        optimizer: bool = False,
        wrap: Callable[[Any], Any] = lambda f: f,
        call_first: int = 0,
        window_s: float = math.inf,
    ) -> None:
        self.mode = mode
        self.blocks = blocks
        self.first, self.stop = first, stop
        self.optimizer = optimizer
        self._wrap = wrap
        self._handles: list[Any] = []
        self._pushed = 0
        self._seq0 = -1
        self._live = False
        self.nodes = 0  # autograd nodes of the piece's backward, hooked
        self.failed = False
        self._held: frozenset[int] = frozenset()  # id() of parameters whose accumulator outlives graphs
        # The optimizer's window: its calls counted this step, where the window starts and closed.
        self.calls = 0
        self.call_first = call_first
        self.call_stop: int | None = None
        self.window_s = window_s
        self.window_used = 0.0  # seconds the window was open, this step
        self.opened_at = 0.0
        self._window = _Window(self) if optimizer and window_s < math.inf else None
        self._windowed = False  # the window's function mode on the stack

    def modules(self, model: torch.nn.Module) -> Iterable[torch.nn.Module]:
        """The modules whose forward runs in this piece: its blocks' (and at the model's ends, every module
        outside the blocks); none for the optimizer's piece."""
        if self.optimizer:
            return []
        inside = [m for block in self.blocks[self.first : self.stop] for m in block.modules()]
        if self.first > 0 and self.stop < len(self.blocks):
            return inside
        in_blocks = {id(m) for block in self.blocks for m in block.modules()}
        return inside + [m for m in model.modules() if id(m) not in in_blocks]

    # -- the mode on and off ------------------------------------------------------------------------

    def _push(self) -> None:
        TorchDispatchMode.__enter__(self.mode)  # (the mode's own __enter__ may do more: the base one only)
        self._pushed += 1

    def _pop(self) -> None:
        if self._pushed > 0:
            self._pushed -= 1
            TorchDispatchMode.__exit__(self.mode, None, None, None)

    # -- the step's boundaries ----------------------------------------------------------------------

    def open(self, params: Iterable[torch.Tensor] = ()) -> None:
        """The step begins; ``params``: the piece's parameters, whose gradient accumulators something may
        hold beyond a graph (then the piece's backward leaves them unhooked)."""
        self._live = True
        if self.optimizer:
            return
        self._held = held_accumulators(params)
        n = len(self.blocks)
        hook = self._wrap(self._block_starts)
        for index in {self.first, self.stop} - {0, n}:  # the model's own hooks are the tracker's
            self._handles.append(self.blocks[index].register_forward_pre_hook(hook, with_kwargs=True))

    def model_begins(self) -> None:
        if self._live and not self.optimizer and self.first == 0 and self._seq0 == -1:
            self._guarded(self._begin)

    def model_ends(self, output: Any) -> None:
        if self._live and self._seq0 >= 0 and self.stop == len(self.blocks):
            self._guarded(self._end, output)

    def optimizer_begins(self) -> None:
        if not (self._live and self.optimizer):
            return
        if self._window is None:  # the whole step: the mode on
            if not self._pushed:
                self._guarded(self._push)
        elif not self._windowed:
            self._guarded(self._open_window)

    def optimizer_ends(self) -> None:
        if self.optimizer:
            self._guarded(self._pop if self._window is None else self._close_window)

    def _open_window(self) -> None:
        assert self._window is not None
        TorchFunctionMode.__enter__(self._window)
        self._windowed = True

    @property
    def calls_left(self) -> int | None:
        """Where the optimizer's next window starts; None: none is left (this one ran to the last call)."""
        stop = self.call_stop
        return stop if stop is not None and stop < self.calls else None

    def window_closes(self) -> None:
        """The optimizer's window closes: the mode off, the time it was on counted."""
        if self._pushed:
            self.window_used += perf_counter() - self.opened_at
            while self._pushed:
                self._pop()

    def _close_window(self) -> None:
        window = self._window
        if self._windowed and window is not None:
            self.window_closes()
            self._windowed = False
            TorchFunctionMode.__exit__(window, None, None, None)

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        """A boundary of the piece; a failure ends the piece (mode off), never the step."""
        try:
            fn(*args)
        except Exception:
            self.failed = True
            self._live = False
            while self._pushed:
                try:
                    self._pop()
                except Exception:
                    self._pushed = 0
            try:
                self._close_window()
            except Exception:
                self._windowed = False

    def close(self) -> None:
        """The step ends: every hook removed, the modes off."""
        self._live = False
        while self._pushed:
            self._pop()
        self._close_window()
        for handle in self._handles:
            try:
                handle.remove()
            except Exception:  # (a graph already freed)
                self.failed = True
        self._handles = []

    # -- forward --------------------------------------------------------------------------------------

    def _block_starts(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self._live or not torch.is_grad_enabled():
            return
        blocks = self.blocks
        if self._seq0 == -1 and module is blocks[self.first]:
            self._guarded(self._begin)
        elif self._seq0 >= 0 and self.stop < len(blocks) and module is blocks[self.stop]:
            self._guarded(self._end, (args, kwargs))  # what flows into the next block: the piece's outputs

    def _begin(self) -> None:
        assert _SEQUENCE_NR is not None
        self._seq0 = _SEQUENCE_NR()
        self._push()

    def _end(self, outputs: Any) -> None:
        assert _SEQUENCE_NR is not None
        seq1 = _SEQUENCE_NR()
        self._pop()
        self._live = self._live and not self.failed
        try:
            self._hook_backward(outputs, self._seq0, seq1)
        except Exception:  # no backward for this piece; its forward stands
            self.failed = True
        self._seq0 = -2  # (done: a later forward of the step is not this piece's)

    # -- backward -------------------------------------------------------------------------------------

    def _hook_backward(self, outputs: Any, seq0: int, seq1: int) -> None:
        """A pre-hook (mode on) on every autograd node the piece's forward made: those reached from its
        outputs whose sequence number is in ``[seq0, seq1)`` (and the gradient accumulators of the
        parameters they use)."""
        stack: list[Any] = []
        _grad_fns(outputs, stack)
        seen: set[int] = set()
        pre = self._node_pre
        while stack:
            node = stack.pop()
            key = id(node)
            if key in seen:
                continue
            seen.add(key)
            seq = node._sequence_nr()
            if seq < seq0:
                continue  # an earlier piece's, or made before the step
            accumulator = type(node).__name__ == "AccumulateGrad"
            if seq >= seq1 and not accumulator:
                continue
            if accumulator and id(getattr(node, "variable", None)) in self._held:
                # (held beyond the graph — DDP's reducer holds them for the whole run: a hook there stays in
                # C++ even once removed and would take the GIL on every later backward; its accumulation
                # runs outside the piece's mode)
                continue
            handle = node.register_prehook(pre)
            if accumulator:  # (kept, and removed as the piece closes: held by someone now, it may outlive us)
                self._handles.append(handle)
            # (any other node's handle dropped at once: the hook goes with the graph after backward, and does
            # nothing once the piece is closed — thousands of handles kept to the step's end made gc work)
            self.nodes += 1
            stack.extend(fn for fn, _ in node.next_functions if fn is not None)

    def _node_pre(self, grad_outputs: Any) -> None:
        if self._live and _PUSH is not None:
            _PUSH(self.mode)  # (off again as autograd restores the thread state after the node)


class PiecePlan:
    """Which piece comes next: the blocks in runs of ``per_piece`` (adapted to what the last piece cost),
    then the optimizer's calls in windows."""

    def __init__(self, blocks: Iterable[torch.nn.Module], per_piece: int) -> None:
        self.blocks = list(blocks)
        self.per_piece = max(1, min(int(per_piece), len(self.blocks)))
        self.next_block = 0  # where the next piece starts; len(blocks): the optimizer's is next
        self.next_call = 0  # the optimizer's call where its next window starts
        self.done = False

    def next(self) -> tuple[int, int, bool]:
        """(first block, stop block, the optimizer's piece) of the next piece."""
        n = len(self.blocks)
        if self.next_block >= n:
            return n, n, True
        stop = min(n, self.next_block + self.per_piece)
        if n - stop < max(1, self.per_piece // 2):  # a short remainder joins this piece
            stop = n
        return self.next_block, stop, False

    def finished(
        self, first: int, stop: int, optimizer: bool, cost_share: float | None, call_stop: int | None = None
    ) -> None:
        """That piece ran; ``cost_share``: what it added to its step, as a share of a usual step (None:
        unknown). The next piece is sized to add about ``TARGET_SHARE``. An optimizer's window that closed
        at ``call_stop`` leaves the rest of its calls to the next; one that ran to the end (None) ends the
        plan."""
        if optimizer:
            if call_stop is None or call_stop <= self.next_call:
                self.done = True
            else:
                self.next_call = call_stop
            return
        self.next_block = stop
        if cost_share is not None and cost_share > 0:
            scaled = (stop - first) * TARGET_SHARE / cost_share
            self.per_piece = max(1, min(len(self.blocks), int(scaled)))


TARGET_SHARE = 0.3  # what a piece may add to its step, as a share of a usual step
# What the calls in an optimizer's window may take under the instrument, as a share of a usual step. A
# window's step costs more than its calls: the window's counting (~3 µs a call of the whole optimizer's)
# and, traced, the trace's work on the rest of the step — on an 8-block MLP ~0.5-1 usual step whatever the
# window. Smaller windows only make more such steps: at 0.25 its first steps held 53 usual steps up in all
# and 27 steps by more than one; at 0.5, 24 and 8 (``profile_first_steps.py --blocks 8``, 7 rounds).
WINDOW_SHARE = 0.5


__all__ = ["MIN_BLOCKS", "TARGET_SHARE", "WINDOW_SHARE", "Piece", "PiecePlan", "repeated_blocks"]
