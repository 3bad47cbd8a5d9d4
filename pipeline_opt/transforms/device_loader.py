"""Device loader (placeholder)."""


class DeviceLoader:
    pass
