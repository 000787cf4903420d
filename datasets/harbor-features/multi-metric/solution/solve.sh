#!/bin/bash
cat > /app/fib.sh <<'SCRIPT'
#!/bin/bash
a=0 b=1
for _ in $(seq 25); do
    next=$((a + b)) a=$b b=$next
done
echo "$a"
SCRIPT
chmod +x /app/fib.sh
