"""When the readings kelvin still accepts with a warning go away (CHANGELOG.md, "Deprecated")."""

#: The release that drops the snake_case policy keys and the unit-less ``kelvin.dev/gpu-memory`` of bound pods.
REMOVED_IN = "0.3.0"
