"""The host, read once (``probe``), every decision that depends on it made from that reading (``plan``), the
known package sets (``stacks``), and the set-up step that installs the one that fits (``install``)."""
