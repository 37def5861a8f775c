from fxlens.cli.main import main

raise SystemExit(main())
