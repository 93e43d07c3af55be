"""What every layer uses: where mtplab keeps things, file locks, host and device arrays alike."""
