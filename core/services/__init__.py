"""Services: plain module-level functions with keyword-only arguments. They validate, apply the tenancy rules
and change the ORM objects; they never commit (the request, task or loop iteration that opened the session does).
"""
