"""A stand-in for GitHub (OAuth web flow and REST) that the real GitHubOAuthenticator uses."""

from .sim import GitHubSim
from .state import GitHubState, OAuthError, SimError

__all__ = ["GitHubSim", "GitHubState", "OAuthError", "SimError"]
