from fxlens.cli import main

raise SystemExit(main())
