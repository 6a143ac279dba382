from kanri.kafka.broker.launch import main

main()
