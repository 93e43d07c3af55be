"""What makes a number trustworthy: the checked pass against an independent reference (lossless), its verdict, the audit of every timed run and aggregate, and named warnings."""
