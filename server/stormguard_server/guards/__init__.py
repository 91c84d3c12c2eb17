"""Who may: drive the admin endpoint (``admin_guard``), and send ``x-priority:
critical`` (``priority_trust``). Both are decided before any route runs."""
