from rltrace.cli import console

console()
