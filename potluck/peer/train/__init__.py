"""The networked step of one stage: trainer (the door), pipeline (1F1B over the mailbox), schedule (the
1F1B order), commit (every peer applies step s, or none does).
"""
