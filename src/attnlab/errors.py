"""Errors a user can fix. The command line prints them as one line and exits with code 2."""


class AttnlabError(Exception):
    """A problem with the user's input (file, config, checkpoint...) whose message says how to fix it."""


class ConfigError(AttnlabError, ValueError):
    """An invalid configuration value or key."""


class DataError(AttnlabError):
    """A missing, empty, undecodable or malformed data file."""


class CheckpointError(AttnlabError):
    """A checkpoint folder that is missing, corrupt, or belongs to another model."""
