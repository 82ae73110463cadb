"""Regenerate the synthetic held-out set committed in data/heldout/.

    python -m gravityocr.model.training.heldout OUTDIR

Seeds start at 10**9; training draws its crops from seeds below 10**9, so no held-out crop
is ever a training crop. Text crops lean towards the harder curriculum stages; tables and
formulas come from the stages that have them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gravityocr.model.evaluation.manifest import ManifestItem, save_crop_image, write_manifest
from gravityocr.model.training.curriculum import CURRICULUM, stage_by_name
from gravityocr.model.training.synthetic import generate_crop

HELDOUT_SEED = 10**9

# (kind, stage name, how many crops)
HELDOUT_PLAN: list[tuple[str, str, int]] = [
    ("text", stage.name, count)
    for stage, count in zip(CURRICULUM, [4, 7, 11, 15, 18, 22, 25, 29, 33, 36])  # 200, weighted to hard
] + [
    (kind, name, count)
    for kind in ("table", "formula")
    for name, count in (("tables-formulas-intro", 15), ("tables-formulas", 20), ("hard", 25))  # 60 each
]


def make_heldout(outdir: str | Path, seed: int = HELDOUT_SEED) -> list[ManifestItem]:
    outdir = Path(outdir).resolve()
    items = []
    for kind, name, count in HELDOUT_PLAN:
        stage = stage_by_name(name)
        for _ in range(count):
            crop = generate_crop(seed, stage, kind)
            item_id = f"{kind}-{name}-{seed}"
            path = outdir / "images" / f"{item_id}.png"
            save_crop_image(crop.image, path)
            items.append(ManifestItem(item_id, path, kind, crop.text))
            seed += 1
    write_manifest(outdir, items)
    return items


def write_synthetic_set(directory: str | Path, seed: int, n: int, stage, kind: str | None = None,
                        id_prefix: str = "synthetic") -> list[ManifestItem]:
    """Render crops for seeds seed..seed+n-1 to `images/<id>.png` and write their manifest
    (`gravityocr bench ablation`'s held-out crops)."""
    directory = Path(directory).resolve()
    items = []
    for offset in range(n):
        crop = generate_crop(seed + offset, stage, kind)
        item_id = f"{id_prefix}-{seed + offset}"
        path = directory / "images" / f"{item_id}.png"
        save_crop_image(crop.image, path)
        items.append(ManifestItem(item_id, path, crop.type, crop.text))
    write_manifest(directory, items)
    return items


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--seed", type=int, default=HELDOUT_SEED)
    args = parser.parse_args(argv)
    items = make_heldout(args.outdir, args.seed)
    size = sum(p.stat().st_size for p in args.outdir.rglob("*") if p.is_file())
    counts = {kind: sum(item.type == kind for item in items) for kind in ("text", "table", "formula")}
    print(f"wrote {len(items)} items {counts} to {args.outdir} ({size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
