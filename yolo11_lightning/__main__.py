"""``python -m yolo11_lightning`` is the same front door as the ``yolo11-lightning`` script."""

from yolo11_lightning.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
