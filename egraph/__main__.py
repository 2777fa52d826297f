from egraph.tools.cli import main
raise SystemExit(main())
