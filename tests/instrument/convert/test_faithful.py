"""Faithful output: every line no rule touches comes back byte for byte (comments, odd
spacing, line endings, tabs), and converting our own output again changes nothing, while
someone else's Horovod script is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from instrument.convert import convert
from instrument.convert.report import Status
from tests.instrument.convert.helpers import conv, removed

SCRIPTS = sorted((Path(__file__).parent / "scripts").glob("*.py"))

ODD = '''\
#!/usr/bin/env python
# -*- coding: utf-8 -*-
"""A script written oddly on purpose."""
import torch ;  import torch.nn as nn   # two imports, one line
from torch.utils.data import (DataLoader,
                              TensorDataset)  # parenthesized


model = nn.Sequential(nn.Linear( 4,2 ),   # spaces inside
                      nn.ReLU())
opt = torch.optim.SGD(model.parameters(),
                      lr = 0.1 ,       # keyword with spaces
                      momentum=0.9)
loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)),
                    batch_size = 2,
                    shuffle = True,    # shuffled
                    )
x = [1,
  2,   3]  ;  y = {'a':1}
for epoch in range( 2 ) :   # odd spacing
\tfor xb, yb in loader:
\t\topt.zero_grad()
\t\tloss = ((model(xb) - yb) ** 2).mean()   # mse
\t\tloss.backward() ;
\t\topt.step()
\t\tprint( 'loss' ,
\t\t       loss.item() )   # continuation of a tab-indented line
if True: pass  # one-line suite
'''


def test_untouched_lines_keep_every_byte() -> None:
    r = conv(ODD)
    # only these original lines change: the loader's dataset (named, for its sampler), its
    # shuffle argument (taken over by the sampler) and the print (now in a rank-0 block, one
    # tab deeper); nothing else moves
    assert removed(r) == ["loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)),",
                          "                    shuffle = True,    # shuffled",
                          "\t\tprint( 'loss' ,", "\t\t       loss.item() )   # continuation of a tab-indented line"]
    out = r.output.splitlines()
    for line in ODD.splitlines():
        if line not in removed(r):
            assert line in out, line
    # new blocks follow the file's tabs, and the continuation line moves with its statement
    assert "\tgroup[\"lr\"] *= hvd.size()" in out
    assert "\t\tif hvd.rank() == 0:" in out
    assert "\t\t\tprint( 'loss' ," in out and "\t\t\t       loss.item() )   # continuation of a tab-indented line" in out
    assert ("                    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas="
            "hvd.size(), rank=hvd.rank(), shuffle=True),    # shuffled") in out


def test_windows_line_endings_are_kept() -> None:
    source = ODD.replace("\t", "    ").replace("\n", "\r\n")
    r = convert(source)
    assert r.status is Status.CONVERTED
    assert "\r\n" in r.output and "\n" not in r.output.replace("\r\n", "")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_converting_a_converted_script_changes_nothing(script: Path) -> None:
    once = convert(script.read_text())
    assert once.status is Status.CONVERTED and once.changed
    twice = convert(once.output)
    assert twice.status is Status.ALREADY_CONVERTED and twice.exit_status == 0
    assert twice.output == once.output and not twice.diff()


def test_someone_elses_horovod_script_is_refused_not_skipped() -> None:
    theirs = convert(convert(ODD).output.replace("  # added by instrument horovodize", ""))
    assert theirs.status is Status.REFUSED and theirs.refusals[0].code == "already_distributed"


def test_a_refused_script_comes_back_unchanged() -> None:
    r = convert("import torch\nmodel = torch.nn.DataParallel(net)\n")
    assert r.output == r.source and r.diff() == ""
