def word_count(text):
    """How often each word occurs, lowercased, punctuation around words ignored."""
    counts = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return counts
