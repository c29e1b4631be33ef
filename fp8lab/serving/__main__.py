"""``python -m fp8lab.serving --profile NAME [-p NAME VALUE ...]``: Study 01's time plan
(:func:`fp8lab.serving.estimate.main`)."""

from fp8lab.serving.estimate import main

raise SystemExit(main())
