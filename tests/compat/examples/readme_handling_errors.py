"""openai-python README, "Handling errors".

The README's call is ``client.fine_tuning.jobs.create(...)``, outside stormguard's
surface; here the same handlers wrap a call that fails the same ways, the lookup of a
fine-tuned model the server does not serve."""

import stormguard as openai
from stormguard import OpenAI

client = OpenAI()

try:
    client.models.retrieve("ft:gpt-4o:my-org:custom_suffix:id")
except openai.APIConnectionError as e:
    print("The server could not be reached")
    print(e.__cause__)  # an underlying Exception, likely raised within httpx.
except openai.RateLimitError as e:  # noqa: F841 (as in the README)
    print("A 429 status code was received; we should back off a bit.")
except openai.APIStatusError as e:
    print("Another non-200-range status code was received")
    print(e.status_code)
    print(e.response)
