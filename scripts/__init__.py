"""The command-line tools (thin layers over `mindgrpo`); each also imports as `scripts.NAME`."""
