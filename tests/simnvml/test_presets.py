"""The named presets: the shipped JSON files match the code, and each one runs."""

from __future__ import annotations

import json

import pynvml
import pytest

from tui.simnvml import Scenario, install, uninstall
from tui.simnvml.presets import PRESETS, path, preset


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_packaged_json_matches_the_code(name):
    shipped = json.loads(path(name).read_text())
    assert shipped == preset(name).to_dict(), f"regenerate with: python -m tui.simnvml.presets ({name})"
    assert Scenario.from_json(path(name)) == preset(name)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_behaves_as_named(name):
    box = preset(name)
    install(box)
    try:
        if box.faults.library_missing:
            with pytest.raises(pynvml.NVMLError_LibraryNotFound):
                pynvml.nvmlInit()
            return
        if box.faults.init_error:
            with pytest.raises(pynvml.NVMLError) as caught:
                pynvml.nvmlInit()
            assert caught.value.value == getattr(pynvml, f"NVML_ERROR_{box.faults.init_error}")
            return
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() == len(box.gpus)
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(len(box.gpus))]
        assert names == [g.name for g in box.gpus]
        pynvml.nvmlShutdown()
    finally:
        uninstall()
