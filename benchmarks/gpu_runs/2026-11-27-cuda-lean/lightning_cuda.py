"""A Lightning fit on the GPU with and without AnatomyCallback: losses, how the hooked steps ended, time."""
import collections, sys, time, tempfile, logging
import torch
import lightning.pytorch as pl
from anatomy.hook.ordinary import OrdinarySteps
from anatomy.lightning import AnatomyCallback
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
acc = sys.argv[1] if len(sys.argv) > 1 else "gpu"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 400
counts = collections.Counter()
rp, re_ = OrdinarySteps._promote, OrdinarySteps._end_ordinary
def p(self):
    counts[f"promoted@{self._lean.stage}"] += 1; return rp(self)
def e(self, i, *a):
    d = re_(self, i, *a)
    counts["lean end" if d and self._lean.active else f"end_ordinary={d}"] += 1
    return d
OrdinarySteps._promote, OrdinarySteps._end_ordinary = p, e
class M(pl.LightningModule):
    def __init__(self):
        super().__init__(); torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.losses = []
    def forward(self, x): return self.net(x)
    def training_step(self, batch, i):
        x, y = batch; loss = torch.nn.functional.mse_loss(self(x), y); self.losses.append(loss.detach()); return loss
    def configure_optimizers(self): return torch.optim.AdamW(self.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
data = torch.utils.data.TensorDataset(torch.randn(64 * N, 64, generator=g), torch.randn(64 * N, 1, generator=g))
class T(pl.Callback):
    def __init__(self): self.t = []
    def on_train_batch_start(self, *a): self.t0 = time.perf_counter()
    def on_train_batch_end(self, *a): self.t.append(time.perf_counter() - self.t0)
out = {}
for hooked in (False, True, False, True):
    m, timer = M(), T()
    cbs = [timer] + ([AnatomyCallback(directory=__import__("pathlib").Path(tempfile.mkdtemp()))] if hooked else [])
    counts.clear()
    tr = pl.Trainer(max_epochs=1, accelerator=acc, devices=1, enable_progress_bar=False, enable_model_summary=False, logger=False, enable_checkpointing=False, callbacks=cbs, default_root_dir=tempfile.mkdtemp())
    tr.fit(m, torch.utils.data.DataLoader(data, batch_size=64))
    losses = torch.stack(m.losses).cpu()
    ts = sorted(timer.t[20:])
    print(f"hooked={hooked}: median batch {ts[len(ts)//2]*1e6:.0f} µs, p90 {ts[int(len(ts)*.9)]*1e6:.0f} µs over {len(timer.t)} batches; {dict(counts) if hooked else ''}", flush=True)
    if hooked in out: print("  losses as the run before of the same kind:", torch.equal(out[hooked], losses))
    out[hooked] = losses
print("losses with hook == without:", torch.equal(out[True], out[False]))
