"""The logic of the record-based stores (journal and memory): state replayed from records,
histories, export and import."""
