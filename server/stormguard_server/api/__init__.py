"""The OpenAI API: request bodies, the one generation flow every route shares, the
answers' shapes (chat, completions, Responses, embeddings), tools and structured
output."""
