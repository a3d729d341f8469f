"""MkDocs hook (mkdocs.yml ``hooks``): the experiments' figures, which live beside their CSVs in
experiments/**/results/, join the site at their repository paths, so the results pages show them without a copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent


def on_files(files: Files, config: Any) -> Files:
    """Add every experiments/**/results/*.png as ``experiments/...`` of the site (mkdocs' ``on_files`` event)."""
    for png in sorted(ROOT.glob("experiments/**/results/*.png")):
        files.append(
            File(png.relative_to(ROOT).as_posix(), str(ROOT), config["site_dir"], config["use_directory_urls"])
        )
    return files
