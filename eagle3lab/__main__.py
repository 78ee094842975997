from eagle3lab.cli import main

raise SystemExit(main())
