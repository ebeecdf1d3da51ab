#!/usr/bin/env python3
"""Dumps the quantization maps of the installed torchao in the format of qmaps_torchao.txt.

lbopt embeds the maps of the torchao release it is tested against (tests/data/qmaps_torchao_current.txt ->
kernels/codebooks.h via tools/gen_codebooks.py): the 8-bit maps come from float32 torch.linspace and differ by up
to 2 ulps between torch builds.

usage: tools/dump_torchao_qmaps.py > tests/data/qmaps_torchao_current.txt
"""
import struct

import torch
import torchao
from torchao.optim import subclass_4bit, subclass_8bit


def rows(values):
    for code, v in enumerate(values):
        f = struct.unpack("<f", struct.pack("<f", float(v)))[0]
        yield f"{code:3d}  {f:.9g}  0x{struct.unpack('<I', struct.pack('<f', f))[0]:08x}"


print(f"# torchao {torchao.__version__} quantization maps, dumped on torch {torch.__version__} by "
      "tools/dump_torchao_qmaps.py. Columns: code  value(%.9g)  ieee754-hex")
for title, values in [("8-bit SIGNED", subclass_8bit.get_qmap_signed()),
                      ("8-bit UNSIGNED", subclass_8bit.get_qmap_unsigned()),
                      ("4-bit SIGNED", subclass_4bit.get_qmap_signed()),
                      ("4-bit UNSIGNED", subclass_4bit.get_qmap_unsigned())]:
    print(f"\n## QMAP {title}  entries={len(values)}")
    print("\n".join(rows(values)))
