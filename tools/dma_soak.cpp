// Stub: issue 6 (soak) fills this in.
int main() { return 0; }
