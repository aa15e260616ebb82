"""Errors a user can fix. The command line prints them as one line and exits with code 2."""


class AttnlabError(Exception):
    """A problem with the user's input (file, config, checkpoint...) whose message says how to fix it.
    `same_in_every_process`: under torchrun every process meets it alike, so the command line prints it once."""

    same_in_every_process = False


class ConfigError(AttnlabError, ValueError):
    """An invalid configuration value or key."""

    same_in_every_process = True


class PathError(ConfigError):
    """A path setting this process cannot use (a folder it cannot make or write, one another run holds): the file
    system's answer, which under torchrun may be one process's own (another node's disk), where a refused value
    is every process's alike."""

    same_in_every_process = False


class DataError(AttnlabError):
    """A missing, empty, undecodable or malformed data file."""


class UnknownToken(DataError):
    """Text with a character or word that a tokenizer without an unk token cannot encode. `token` is what it
    could not encode and `position` its character offset in the text (None where unknown), so a caller
    that knows the file can name the line."""

    def __init__(self, message: str, token: str, position: int | None = None):
        super().__init__(message)
        self.token, self.position = token, position


class CheckpointError(AttnlabError):
    """A checkpoint folder that is missing, corrupt, or belongs to another model."""


def a_name(name: str) -> str:
    """`name` quoted, after the article it takes in a message: "an 'encoder'", "a 'gpt'"."""
    return f"{'an' if str(name)[:1].lower() in 'aeiou' else 'a'} {name!r}"


def one_line(error: BaseException) -> str:
    """The first line of an error's message, for a one-line report. Python's refusal to read a number of more
    than 4,300 digits from text (JSON, TOML, YAML), whose advice is a call for programmers, in a user's words."""
    if isinstance(error, ValueError) and "integer string conversion" in str(error):
        return "a number of more than 4,300 digits"
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


class Terminated(KeyboardInterrupt):
    """SIGTERM (what Slurm, docker and systemd send to stop a job), raised by the command line where Ctrl-C raises
    KeyboardInterrupt, so that the same path saves a checkpoint; the trainer tells the two apart where they differ."""
