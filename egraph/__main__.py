from egraph.cli import main
raise SystemExit(main())
